"""Spark gets Iceberg by Maven coordinates, as every Spark user writes it: `spark.jars.packages` holds Iceberg's Spark
runtime and AWS bundle and the JDBC drivers (resolved once by `make setup` into ~/.m2, where Spark's Ivy finds
them offline), and the user's own packages and properties come on top (LAKEHOUSE_SPARK_PACKAGES,
LAKEHOUSE_SPARK_CONF); jobs Airflow submits get the same.

Unit layer: the configuration each path is given, and the embedded Kafka broker's configuration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lakehouse.core import config, errors, sparkenv


@pytest.fixture
def platform_with(monkeypatch, tmp_path):
    def with_(**env: str) -> config.PlatformConfig:
        monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
        for name in ("LAKEHOUSE_SPARK_PACKAGES", "LAKEHOUSE_SPARK_CONF", "LAKEHOUSE_JARS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return config.load(fresh=True)

    return with_


def test_iceberg_reaches_spark_by_maven_coordinates(platform_with):
    conf = sparkenv.spark_conf(platform_with(), ["lake"], "app")
    packages = conf["spark.jars.packages"].split(",")
    assert packages == list(config.SPARK_PACKAGES)
    assert f"org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:{config.ICEBERG_VERSION}" in packages
    assert f"org.apache.iceberg:iceberg-aws-bundle:{config.ICEBERG_VERSION}" in packages
    assert "spark.jars" not in conf  # no jar taken out of anything


def test_the_users_packages_and_properties_come_on_top(platform_with):
    platform = platform_with(LAKEHOUSE_SPARK_PACKAGES="org.apache.hadoop:hadoop-aws:3.3.4, com.example:udfs:1.2",
                             LAKEHOUSE_SPARK_CONF='{"spark.executor.memory": "4g", "spark.sql.shuffle.partitions": 64,'
                                                  ' "spark.ui.enabled": true}',
                             LAKEHOUSE_JARS="/opt/jars/extra.jar")
    conf = sparkenv.spark_conf(platform, ["lake"], "app")
    assert conf["spark.jars.packages"].split(",") == [*config.SPARK_PACKAGES, "org.apache.hadoop:hadoop-aws:3.3.4",
                                                      "com.example:udfs:1.2"]
    assert (conf["spark.executor.memory"], conf["spark.sql.shuffle.partitions"], conf["spark.ui.enabled"]) == \
        ("4g", "64", "true")  # the user's win over the platform's own
    assert conf["spark.jars"] == "/opt/jars/extra.jar"


@pytest.mark.parametrize("env, words", [
    ({"LAKEHOUSE_SPARK_PACKAGES": "hadoop-aws"}, "is not a Maven coordinate"),
    ({"LAKEHOUSE_SPARK_CONF": "spark.executor.memory=4g"}, "is not JSON"),
    ({"LAKEHOUSE_SPARK_CONF": '{"executor.memory": "4g"}'}, "Spark properties"),
    ({"LAKEHOUSE_SPARK_CONF": '["spark.x"]'}, "JSON object"),
])
def test_a_malformed_spark_setting_is_refused_naming_it(platform_with, env, words):
    with pytest.raises(errors.ConfigurationError, match=words):
        platform_with(**env)


def test_airflow_submits_with_the_same_packages_and_properties(platform_with, make_spec, monkeypatch):
    from lakehouse_airflow.spark import submit_kwargs

    platform_with(LAKEHOUSE_SPARK_CONF='{"spark.executor.memory": "2g"}')
    kwargs = submit_kwargs(make_spec(), "ingest", "--once")
    assert kwargs["packages"].split(",") == list(config.SPARK_PACKAGES) and kwargs["jars"] is None
    assert kwargs["conf"]["spark.executor.memory"] == "2g"
    assert kwargs["env_vars"]["LAKEHOUSE_SPARK_CONF"] == '{"spark.executor.memory": "2g"}'


def test_setup_resolves_exactly_the_packages_the_platform_configures():
    setup = (Path(config.REPO_ROOT) / "scripts" / "setup.sh").read_text()
    assert "from lakehouse.core.config import SPARK_PACKAGES" in setup and "dependency:get" in setup


def test_the_embedded_broker_is_one_kraft_node_with_every_listener_and_acls_enforced(tmp_path):
    from lakehouse_dev import kafka_broker

    layout = kafka_broker.Layout(tmp_path)
    ports = {"PLAINTEXT": 19092, "SSL": 19093, "SASL_PLAINTEXT": 19094, "SASL_SSL": 19095, "CONTROLLER": 19096}
    props = dict(line.split("=", 1) for line in
                 kafka_broker.server_properties(layout, ports, tmp_path / "ks.pem").splitlines())
    assert props["process.roles"] == "broker,controller" and props["controller.quorum.voters"] == "1@127.0.0.1:19096"
    assert props["listeners"] == ("PLAINTEXT://127.0.0.1:19092,SSL://127.0.0.1:19093,SASL_PLAINTEXT://127.0.0.1:19094,"
                                  "SASL_SSL://127.0.0.1:19095,CONTROLLER://127.0.0.1:19096")
    assert "CONTROLLER" not in props["advertised.listeners"] and props["log.dirs"] == str(layout.data)
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false" and props["super.users"] == "User:ANONYMOUS"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,SCRAM-SHA-256"
    assert props["ssl.keystore.type"] == "PEM" and props["auto.create.topics.enable"] == "false"
    assert kafka_broker.cluster_id() != kafka_broker.cluster_id() and len(kafka_broker.cluster_id()) == 22
