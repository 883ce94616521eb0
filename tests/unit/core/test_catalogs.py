"""Catalogs by configuration: each catalog name is a jdbc, rest, glue or hive catalog, configured as Iceberg users
configure it (pyiceberg's `.pyiceberg.yaml` or PYICEBERG_CATALOG__<NAME>__<PROP>, else the platform's
LAKEHOUSE_CATALOG_URI), and Spark and pyiceberg open the same one; two catalog names never share a table
directory; secrets never show.

Unit layer: the configuration each side is given. The REST catalog itself, end to end, is in
tests/e2e/test_rest_catalog.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lakehouse.core import config, errors, sparkenv
from lakehouse.core.catalog import open_catalog

SECRET = "client-secret-0b1c2d"


@pytest.fixture
def platform_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """of(**env) -> PlatformConfig loaded with those variables, no .pyiceberg.yaml but the one a test writes."""
    for name in ("LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path / "pyiceberg-home"))
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()

    def of(**env: str) -> config.PlatformConfig:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return config.load(fresh=True)

    return of


def spark_catalog(platform: config.PlatformConfig, name: str) -> dict[str, str]:
    conf = sparkenv.spark_conf(platform, [name], "app")
    prefix = f"spark.sql.catalog.{name}"
    return {key[len(prefix) + 1:]: value for key, value in conf.items() if key == prefix or key.startswith(prefix + ".")}


def test_the_platforms_catalog_is_jdbc_and_each_name_has_its_own_warehouse(platform_of, tmp_path):
    platform = platform_of()
    lake, other = platform.catalog("lake"), platform.catalog("other")
    assert (lake.type, lake.uri) == ("jdbc", f"sqlite:///{tmp_path / 'home' / 'catalog.db'}")
    assert lake.warehouse.endswith("/warehouse/lake") and other.warehouse.endswith("/warehouse/other")
    assert not other.warehouse.startswith(lake.warehouse + "/") and not lake.warehouse.startswith(other.warehouse)
    spark = spark_catalog(platform, "lake")
    assert spark["catalog-impl"] == "org.apache.iceberg.jdbc.JdbcCatalog" and spark["uri"].startswith("jdbc:sqlite:")
    assert spark["warehouse"] == lake.warehouse == open_catalog(platform, "lake").properties["warehouse"]


def test_an_http_catalog_uri_is_a_rest_catalog_for_both_sides(platform_of):
    platform = platform_of(LAKEHOUSE_CATALOG_URI="http://127.0.0.1:8181")
    lake = platform.catalog("lake")
    assert (lake.type, lake.uri, lake.warehouse) == ("rest", "http://127.0.0.1:8181", "")  # locations: the server's
    spark = spark_catalog(platform, "lake")
    assert {k: spark[k] for k in ("", "type", "uri")} == {
        "": "org.apache.iceberg.spark.SparkCatalog", "type": "rest", "uri": "http://127.0.0.1:8181"}
    assert "catalog-impl" not in spark and "warehouse" not in spark
    # the server may place tables on S3: pyiceberg's FileIO writes small files there in one request each
    assert lake.pyiceberg_properties() == {"type": "rest", "uri": "http://127.0.0.1:8181",
                                           "py-io-impl": "lakehouse.core.fileio.DelayedOpenFileIO"}
    told = platform_of(LAKEHOUSE_CATALOG_URI="https://catalog.example/api", LAKEHOUSE_WAREHOUSE="analytics")
    assert told.catalog("lake").warehouse == "analytics"  # a REST warehouse is the server's name for a catalog


def test_pyicebergs_own_configuration_of_a_name_wins_and_reaches_spark(platform_of, tmp_path):
    home = tmp_path / "pyiceberg-home"
    home.mkdir()
    (home / ".pyiceberg.yaml").write_text(yaml.safe_dump({"catalog": {"lake": {
        "type": "rest", "uri": "https://polaris.example/api/catalog", "warehouse": "prod",
        "credential": f"client:{SECRET}", "scope": "PRINCIPAL_ROLE:ALL", "header.X-Iceberg-Access-Delegation":
        "vended-credentials", "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}}}))
    platform = platform_of(PYICEBERG_CATALOG__GLUEY__TYPE="glue", PYICEBERG_CATALOG__GLUEY__WAREHOUSE="s3://b/glue",
                           PYICEBERG_CATALOG__GLUEY__CLIENT__REGION="eu-west-1")
    lake = platform.catalog("lake")
    assert (lake.type, lake.uri, lake.warehouse) == ("rest", "https://polaris.example/api/catalog", "prod")
    assert "pyiceberg configuration" in lake.source
    spark = spark_catalog(platform, "lake")
    assert spark["credential"] == f"client:{SECRET}" and spark["scope"] == "PRINCIPAL_ROLE:ALL"
    assert spark["header.x-iceberg-access-delegation"] == "vended-credentials"  # pyiceberg lower-cases names
    assert "py-io-impl" not in spark  # pyiceberg's own FileIO means nothing to Iceberg's Java catalog
    assert lake.pyiceberg_properties()["py-io-impl"] == "pyiceberg.io.pyarrow.PyArrowFileIO"
    gluey = platform.catalog("gluey")
    assert (gluey.type, gluey.warehouse, gluey.properties) == ("glue", "s3://b/glue", {"client.region": "eu-west-1"})
    assert spark_catalog(platform, "gluey")["type"] == "glue"
    assert platform.catalog("other").type == "jdbc"  # names pyiceberg does not configure: the platform's catalog


def test_catalog_secrets_never_show(platform_of, tmp_path):
    platform = platform_of(PYICEBERG_CATALOG__LAKE__URI="https://catalog.example/api",
                           PYICEBERG_CATALOG__LAKE__CREDENTIAL=f"client:{SECRET}",
                           PYICEBERG_CATALOG__LAKE__TOKEN=SECRET)
    lake = platform.catalog("lake")
    for shown in (repr(platform), repr(lake), str(lake.shown_properties())):
        assert SECRET not in shown
    assert lake.shown_properties() == {"credential": "***", "token": "***"}
    # Spark shows them as *********(redacted) in its UI and event logs
    redaction = sparkenv.spark_conf(platform, ["lake"], "app")["spark.redaction.regex"]
    import re
    assert re.search(redaction, "spark.sql.catalog.lake.credential") and re.search(redaction, "spark.sql.catalog.lake.token")


@pytest.mark.parametrize("env, words", [
    ({"LAKEHOUSE_CATALOG_URI": "mysql://db/iceberg"}, "expected a SQLAlchemy URI"),
    ({"LAKEHOUSE_CATALOG_URI": "thrift://metastore:9083"}, "configured by name in .pyiceberg.yaml"),
    ({"PYICEBERG_CATALOG__LAKE__TYPE": "nessie", "PYICEBERG_CATALOG__LAKE__URI": "http://n"}, "type 'nessie' is not"),
])
def test_a_catalog_the_platform_cannot_open_is_refused_naming_where_it_is_configured(platform_of, env, words):
    platform = platform_of(**env)
    with pytest.raises(errors.ConfigurationError, match=words):
        platform.catalog("lake")


def test_the_stacks_object_store_key_reaches_pyiceberg_and_the_spark_executors_not_the_catalog_conf(platform_of):
    platform = config.PlatformConfig(
        home=Path("/srv/lake"), bootstrap_servers="k:9092", catalog_uri="sqlite:////srv/lake/catalog.db",
        warehouse="s3://lakehouse/warehouse", object_store=config.ObjectStoreConfig(
            endpoint="http://127.0.0.1:9300", path_style_access=True, region="us-east-1",
            access_key_id="AKIDSTACK", secret_access_key=SECRET))
    lake = platform.catalog("lake")
    assert lake.warehouse == "s3://lakehouse/warehouse/lake" and lake.warehouse_on_s3
    assert lake.pyiceberg_properties()["s3.secret-access-key"] == SECRET
    conf = sparkenv.spark_conf(platform, ["lake"], "app")
    assert not any(SECRET in value for key, value in conf.items() if key.startswith("spark.sql.catalog."))
    assert conf["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == SECRET  # redacted by Spark's own regex ("secret")
    assert "-Daws.requestChecksumCalculation=when_required" in conf["spark.driver.extraJavaOptions"]
    assert SECRET not in repr(platform) and SECRET not in repr(lake)
