"""An s3:// warehouse (the compose stack's MinIO): the LAKEHOUSE_S3_* settings reach Spark's
Iceberg catalogs as S3FileIO properties and pyiceberg as its S3 FileIO properties; without an
S3 warehouse nothing changes; credentials never enter either configuration.

No S3 server runs here: these tests check the configuration each side is given, and, for
pyiceberg, the pyarrow S3 filesystem it builds from it. The object store's preflight
(lakehouse.core.warehouse.check, which open_catalog runs) is left out here; tests/e2e/test_rest_catalog.py
runs it against the stack's object store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.core import config, errors, sparkenv, warehouse
from lakehouse.core.catalog import open_catalog

S3_SETTINGS = {
    "LAKEHOUSE_S3_ENDPOINT": "http://minio:9000",
    "LAKEHOUSE_S3_PATH_STYLE_ACCESS": "true",
    "LAKEHOUSE_S3_REGION": "us-east-1",
}
# Distinctive values, to find them anywhere they might leak.
ACCESS_KEY = "AKIDLAKEHOUSETEST0001"
SECRET_KEY = "s3cr3t-lakehouse-test-value-0001"
FILE_JDBC_CATALOG_KEYS = {"", "catalog-impl", "uri", "jdbc.schema-version", "warehouse", "cache-enabled",
                          "jdbc.init-catalog-tables", "jdbc.journal_mode", "jdbc.busy_timeout"}


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """set(warehouse=..., **LAKEHOUSE_S3_*) -> PlatformConfig, on a SQLite catalog in tmp_path with
    AWS credentials in the environment as the compose stack sets them."""
    for name in S3_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", f"sqlite:///{tmp_path / 'catalog.db'}")
    monkeypatch.setenv("LAKEHOUSE_JARS", "/opt/lakehouse/jars/iceberg-spark-runtime.jar")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setattr(warehouse, "check", lambda settings: None)  # no store to ask

    def set_(warehouse: str, **settings: str) -> config.PlatformConfig:
        monkeypatch.setenv("LAKEHOUSE_WAREHOUSE", warehouse)
        for name in S3_SETTINGS:
            monkeypatch.delenv(name, raising=False)
        for name, value in settings.items():
            monkeypatch.setenv(name, value)
        return config.load()

    return set_


def catalog_properties(conf: dict[str, str], name: str) -> dict[str, str]:
    """The `spark.sql.catalog.<name>[.<property>]` entries of a Spark conf, keyed by property."""
    prefix = f"spark.sql.catalog.{name}"
    return {key[len(prefix) + 1:]: value for key, value in conf.items()
            if key == prefix or key.startswith(prefix + ".")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(endpoint=st.none() | st.from_regex(r"https?://[a-z][a-z0-9-]{0,20}(\.[a-z]{2,5})?(:[1-9][0-9]{1,4})?", fullmatch=True),
       path_style=st.none() | st.booleans(), region=st.none() | st.from_regex(r"[a-z]{2}-[a-z]{4,9}-[1-9]", fullmatch=True))
def test_a_store_handed_to_a_child_process_is_the_store_it_reads_back(environment, endpoint, path_style, region):
    """What an Airflow connection gives spark-submit (ObjectStoreConfig.environment) is read back by the job's
    `config.load()` as the same store; the credentials travel as the AWS chain's own variables."""
    store = config.ObjectStoreConfig(endpoint=endpoint, path_style_access=path_style, region=region,
                                     access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
    env = store.environment()
    assert {k: env.pop(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")} == {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    read = environment("s3://lakehouse/warehouse", **env).object_store
    assert (read.endpoint, read.path_style_access, read.region) == (endpoint, path_style, region)


# ---------------------------------------------------------------------------- no S3 warehouse

def test_a_file_warehouse_keeps_the_jdbc_catalog_exactly_as_it_was(environment, tmp_path: Path):
    platform = environment((tmp_path / "warehouse").as_uri())
    conf = sparkenv.spark_conf(platform, ["lake"], "app")
    assert set(catalog_properties(conf, "lake")) == FILE_JDBC_CATALOG_KEYS
    assert not any("s3" in key or "io-impl" in key for key in conf)
    assert platform.object_store == config.ObjectStoreConfig()


def test_s3_settings_do_not_touch_a_file_warehouse(environment, tmp_path: Path):
    warehouse = (tmp_path / "warehouse").as_uri()
    without = environment(warehouse)
    with_settings = environment(warehouse, **S3_SETTINGS)
    assert sparkenv.spark_conf(with_settings, ["lake", "other"], "app") == \
        sparkenv.spark_conf(without, ["lake", "other"], "app")
    # the catalog's own settings only: the database (waiting for locks as Spark does) and its warehouse
    assert open_catalog(with_settings, "lake").properties == \
        open_catalog(without, "lake").properties == {"type": "sql", "uri": f"{without.catalog_uri}?timeout=30",
                                                     "warehouse": f"{warehouse}/lake", "pool_pre_ping": "true"}


# ---------------------------------------------------------------------------- S3 warehouse

@pytest.mark.parametrize("warehouse", ["s3://lakehouse/warehouse", "s3a://lakehouse/warehouse"])
def test_an_s3_warehouse_gives_every_spark_catalog_s3fileio_with_the_settings(environment, tmp_path, warehouse):
    file_conf = sparkenv.spark_conf(environment((tmp_path / "wh").as_uri()), ["lake", "other"], "app")
    conf = sparkenv.spark_conf(environment(warehouse, **S3_SETTINGS), ["lake", "other"], "app")
    for name in ("lake", "other"):
        props = catalog_properties(conf, name)
        assert props["io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
        assert props["s3.endpoint"] == "http://minio:9000"
        assert props["s3.path-style-access"] == "true"
        assert props["client.region"] == "us-east-1"
        assert props["warehouse"] == f"{warehouse}/{name}"  # each catalog its own directory
        # everything else is the JDBC catalog as before
        unchanged = {k: v for k, v in props.items()
                     if k not in ("io-impl", "s3.endpoint", "s3.path-style-access", "client.region", "warehouse")}
        assert unchanged == {k: v for k, v in catalog_properties(file_conf, name).items() if k != "warehouse"}


def test_an_s3_warehouse_without_settings_uses_the_aws_defaults(environment):
    conf = sparkenv.spark_conf(environment("s3://lakehouse/warehouse"), ["lake"], "app")
    props = catalog_properties(conf, "lake")
    assert props["io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert not {"s3.endpoint", "s3.path-style-access", "client.region"} & set(props)


def test_path_style_off_is_said_explicitly_to_both_sides(environment):
    platform = environment("s3://lakehouse/warehouse", LAKEHOUSE_S3_PATH_STYLE_ACCESS="false")
    assert catalog_properties(sparkenv.spark_conf(platform, ["lake"], "app"), "lake")["s3.path-style-access"] == "false"
    assert open_catalog(platform, "lake").properties["s3.force-virtual-addressing"] == "true"


def test_pyiceberg_reaches_the_same_endpoint_region_and_addressing(environment):
    catalog = open_catalog(environment("s3://lakehouse/warehouse", **S3_SETTINGS), "lake")
    assert {k: v for k, v in catalog.properties.items() if k.startswith("s3.")} == {
        "s3.endpoint": "http://minio:9000", "s3.force-virtual-addressing": "false", "s3.region": "us-east-1"}
    # the filesystem pyiceberg reads and writes table files with
    filesystem = catalog._load_file_io(location="s3://lakehouse/warehouse").fs_by_scheme("s3", "lakehouse")
    options = filesystem.__reduce__()[1][0]
    assert options["endpoint_override"] == "http://minio:9000"
    assert options["region"] == "us-east-1"
    assert options["force_virtual_addressing"] is False
    assert options["allow_delayed_open"] is True  # small files in one PutObject (lakehouse.core.fileio)
    # credentials are left to the AWS chain (the environment), not passed in
    assert options["access_key"] is None and options["secret_key"] is None


def test_credentials_appear_in_no_configuration(environment):
    platform = environment("s3://lakehouse/warehouse", **S3_SETTINGS)
    conf = sparkenv.spark_conf(platform, ["lake"], "app")
    catalog = open_catalog(platform, "lake")
    for value in [*conf.values(), *catalog.properties.values(), repr(platform)]:
        assert ACCESS_KEY not in value and SECRET_KEY not in value


# ---------------------------------------------------------------------------- bad settings

@pytest.mark.parametrize(("name", "value"), [
    ("LAKEHOUSE_S3_PATH_STYLE_ACCESS", "sometimes"),
    ("LAKEHOUSE_S3_ENDPOINT", "minio:9000"),
    ("LAKEHOUSE_S3_ENDPOINT", "ftp://minio:9000"),
])
def test_a_malformed_setting_is_a_config_error_naming_it(environment, name, value):
    with pytest.raises(errors.ConfigurationError, match=name):
        environment("s3://lakehouse/warehouse", **{name: value})


@pytest.mark.parametrize(("raw", "parsed"), [("true", True), ("TRUE", True), ("1", True), ("yes", True),
                                             ("false", False), ("0", False), ("no", False)])
def test_path_style_access_accepts_the_usual_booleans(environment, raw, parsed):
    platform = environment("s3://lakehouse/warehouse", LAKEHOUSE_S3_PATH_STYLE_ACCESS=raw)
    assert platform.object_store.path_style_access is parsed


def test_a_catalog_password_never_reaches_output():
    assert config.redact("postgresql+psycopg2://iceberg:s3cr%40t@pg:5432/iceberg") == \
        "postgresql+psycopg2://iceberg:***@pg:5432/iceberg"
    assert config.redact("sqlite:////srv/lake/catalog.db") == "sqlite:////srv/lake/catalog.db"
    assert config.redact("postgresql://reader@pg/iceberg") == "postgresql://reader@pg/iceberg"
