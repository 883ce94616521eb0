"""The Spark driver's class archive (AppCDS): made once by `make setup` for the installed Java and PySpark, mapped
by every driver started afterwards (the CLI's, and spark-submit's from Airflow), never by an executor, which may run
on another host; named by a digest of the Java runtime and Spark's jars, so another Java or PySpark finds none.

Unit layer: names and JVM flags. Slow layer: a driver started by the platform loads Spark's classes from the
archive (the JVM's own class-loading log says where each class came from).

The unit half; the end-to-end half is tests/e2e/test_class_archive_e2e.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lakehouse.core import config, sparkenv


@pytest.fixture
def spark_home(tmp_path, monkeypatch) -> Path:
    """A Java runtime and a Spark installation of the test's own (file names only)."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("")
    (tmp_path / "jdk" / "release").write_text('JAVA_VERSION="17.0.15"\n')
    (tmp_path / "spark" / "jars").mkdir(parents=True)
    (tmp_path / "spark" / "jars" / "spark-core_2.12-3.5.9.jar").write_text("")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.delenv("LAKEHOUSE_SPARK_CLASS_ARCHIVE", raising=False)
    monkeypatch.delenv("LAKEHOUSE_SPARK_JAVA_OPTIONS", raising=False)
    return tmp_path


def test_the_archive_is_named_for_the_java_runtime_and_sparks_jars(spark_home):
    first = sparkenv.class_archive()
    assert first.parent == Path(sys.prefix, "share", "lakehouse") and first.suffix == ".jsa"
    assert sparkenv.class_archive() == first  # stable
    (spark_home / "spark" / "jars" / "spark-core_2.12-3.5.10.jar").write_text("")
    upgraded = sparkenv.class_archive()
    assert upgraded != first
    (spark_home / "jdk" / "release").write_text('JAVA_VERSION="17.0.16"\n')
    assert sparkenv.class_archive() not in (first, upgraded)


@pytest.mark.parametrize("value", ["off", "OFF", "false", "0", "no"])
def test_the_setting_turns_the_archive_off(spark_home, monkeypatch, value):
    monkeypatch.setenv("LAKEHOUSE_SPARK_CLASS_ARCHIVE", value)
    assert sparkenv.class_archive() is None
    assert "SharedArchiveFile" not in sparkenv.java_options_of("driver")


def test_without_java_there_is_no_archive(spark_home, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(spark_home / "nowhere"))
    assert sparkenv.class_archive() is None


def test_only_the_driver_maps_the_archive_and_only_once_it_is_made(spark_home, monkeypatch):
    archive = spark_home / "made.jsa"
    monkeypatch.setattr(sparkenv, "class_archive", lambda: archive)
    monkeypatch.setenv("LAKEHOUSE_SPARK_JAVA_OPTIONS", "-XX:+UseSerialGC")
    assert "SharedArchiveFile" not in sparkenv.java_options_of("driver")  # not made yet: Spark starts as before
    archive.write_bytes(b"")
    driver, executor = sparkenv.java_options_of("driver"), sparkenv.java_options_of("executor")
    assert driver.split() == [f"-Dlog4j.configurationFile=file:{sparkenv.LOG4J}", "-XX:+UseSerialGC",
                              f"-XX:SharedArchiveFile={archive}"]
    assert executor.split() == driver.split()[:2]
    conf = sparkenv.spark_conf(config.load(fresh=True), [], "app")
    assert (conf["spark.driver.extraJavaOptions"], conf["spark.executor.extraJavaOptions"]) == (driver, executor)


def test_airflow_submits_drivers_with_the_same_flags(spark_home, monkeypatch, make_spec):
    """The archive for the driver, and on an S3-compatible store its checksum settings for both sides, as the
    CLI's jobs get them."""
    from lakehouse_airflow.spark import submit_kwargs

    archive = spark_home / "made.jsa"
    archive.write_bytes(b"")
    monkeypatch.setattr(sparkenv, "class_archive", lambda: archive)
    monkeypatch.setenv("LAKEHOUSE_WAREHOUSE", "s3://lakehouse/warehouse")
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT", "http://127.0.0.1:9300")
    spec = make_spec()
    conf = submit_kwargs(spec, "ingest", "--once")["conf"]
    cli = sparkenv.spark_conf(config.load(fresh=True), [spec.catalog], "app")
    for side in ("driver", "executor"):
        assert conf[f"spark.{side}.extraJavaOptions"] == cli[f"spark.{side}.extraJavaOptions"]
        assert "-Daws.requestChecksumCalculation=when_required" in conf[f"spark.{side}.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={archive}" in conf["spark.driver.extraJavaOptions"]
    assert "SharedArchiveFile" not in conf["spark.executor.extraJavaOptions"]


