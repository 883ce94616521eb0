"""Secrets stay out of what Airflow renders, stores and shows, and out of reprs and error messages.

Fast: no Spark, no broker. The Spark jobs' `env_vars` (a templated field) get only the allow-list
of lakehouse.core.config; everything else reaches spark-submit from the worker's environment. That a
rollback never executes SQL text from the timeline needs Spark and a catalog: tests/e2e/test_cutover_e2e.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from lakehouse.core import config, errors
from lakehouse_airflow.spark import forwardable, forwarded_environment, submit_kwargs
from lakehouse_dev import airflow_stack

ALLOWED = config.ENVIRONMENT + config.JOB_ENVIRONMENT
PUBLIC_KAFKA = tuple(config.KAFKA_PREFIX + p.upper().replace(".", "_") for p in config.PUBLIC_KAFKA_PROPERTIES)
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|PASSPHRASE|SECRET|KEY|TOKEN|JAAS|PEM|CREDENTIAL")
PASSWORD = "Zq9-n0t-to-be-5hown"
# variables whose values hold the password: never in env_vars
SECRETS = {
    "LAKEHOUSE_CATALOG_URI": f"postgresql+psycopg2://iceberg:{PASSWORD}@db:5432/iceberg",
    "LAKEHOUSE_KAFKA_SASL_PASSWORD": PASSWORD,
    "LAKEHOUSE_KAFKA_SSL_KEY_PASSWORD": PASSWORD,
    "LAKEHOUSE_KAFKA_SSL_KEY_PEM": PASSWORD,
    "LAKEHOUSE_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": PASSWORD,
    "LAKEHOUSE_KAFKA_SASL_JAAS_CONFIG": f'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                        f'username="lakehouse" password="{PASSWORD}";',
    "LAKEHOUSE_SOMETHING_SECRET": PASSWORD,
    "LAKEHOUSE_AIRFLOW_DB_URI": f"postgresql+psycopg2://airflow:{PASSWORD}@db:5432/airflow",
    # allowed names, but their values carry a password
    "LAKEHOUSE_S3_ENDPOINT": f"http://minio:{PASSWORD}@minio:9000",
    "LAKEHOUSE_KAFKA_CLIENT_ID": f"https://lakehouse:{PASSWORD}@ids.example.com",
}
# settings the jobs read, without secrets: forwarded as they are
SETTINGS = {
    "LAKEHOUSE_BOOTSTRAP_SERVERS": "broker-1:9093,broker-2:9093",
    "LAKEHOUSE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "LAKEHOUSE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "LAKEHOUSE_KAFKA_SASL_USERNAME": "lakehouse",
    "LAKEHOUSE_KAFKA_SSL_CA_LOCATION": "/etc/kafka/ca.pem",
    "LAKEHOUSE_WAREHOUSE": "s3://lakehouse/warehouse",
    "LAKEHOUSE_S3_REGION": "us-east-1",
    "LAKEHOUSE_SPARK_CORES_MAX": "4",
    "LAKEHOUSE_SHUFFLE_PARTITIONS": "8",
    "LAKEHOUSE_FAULT": "during_read",
}


def url_password(value: str) -> str | None:
    """The password SQLAlchemy or urllib reads from `value` when it is a URL with one (the oracle)."""
    found = []
    try:
        found.append(make_url(value).password)
    except (ArgumentError, ValueError):
        pass
    try:
        found.append(urlsplit(value).password)
    except ValueError:
        pass
    return next((p for p in found if p), None)


# ---------------------------------------------------------------------------- Spark jobs' env_vars

def test_spark_jobs_get_the_settings_they_read_and_no_secret(make_spec, monkeypatch):
    for name, value in {**SECRETS, **SETTINGS}.items():
        monkeypatch.setenv(name, value)
    spec = make_spec()
    kwargs = submit_kwargs(spec, "ingest", "--once")
    env = kwargs["env_vars"]
    assert {name: env.get(name) for name in SETTINGS} == SETTINGS
    assert env["LAKEHOUSE_PIPELINES_DIR"] == str(Path(spec.path).parent)
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == kwargs["conf"]["spark.pyspark.python"]
    assert not set(SECRETS) & set(env)
    assert PASSWORD not in json.dumps(kwargs)  # nor anywhere else in the operator's arguments


def test_the_catalog_uri_is_forwarded_only_without_a_password():
    assert forwardable("LAKEHOUSE_CATALOG_URI", "sqlite:////srv/lake/catalog.db")
    assert forwardable("LAKEHOUSE_CATALOG_URI", "postgresql+psycopg2://iceberg@db:5432/iceberg")  # e.g. .pgpass
    for uri in ("postgresql+psycopg2://iceberg:pw@db:5432/iceberg",
                "postgresql+psycopg2://iceberg:p/w?x#y@db:5432/iceberg",  # unescaped, as SQLAlchemy takes it
                "postgresql+psycopg2://iceberg@db:5432/iceberg?sslmode=require&password=pw"):
        assert not forwardable("LAKEHOUSE_CATALOG_URI", uri), uri


names = st.one_of(
    st.sampled_from(ALLOWED + PUBLIC_KAFKA + tuple(SECRETS)),
    st.from_regex(r"LAKEHOUSE_KAFKA_[A-Z][A-Z0-9_]{0,30}", fullmatch=True),
    st.from_regex(r"(LAKEHOUSE|PYSPARK|AWS|SPARK)_[A-Z0-9_]{1,30}", fullmatch=True),
)
urls = st.builds(lambda scheme, user, password, host: f"{scheme}://{user}:{password}@{host}/db",
                 st.sampled_from(["postgresql+psycopg2", "postgresql", "http", "s3", "jdbc:postgresql"]),
                 st.from_regex(r"[a-z]{0,8}", fullmatch=True), st.text(min_size=1, max_size=20),
                 st.from_regex(r"[a-z]{1,8}(:[0-9]{2,5})?", fullmatch=True))
values = st.one_of(st.text(max_size=40), urls)


@given(st.dictionaries(names, values, max_size=12))
def test_only_allowed_settings_without_passwords_are_forwarded(environ):
    forwarded = forwarded_environment(environ)
    for name, value in forwarded.items():
        assert environ[name] == value
        assert name in ALLOWED or name in PUBLIC_KAFKA
        assert not SECRET_NAME.search(name), name
        assert url_password(value) is None, (name, value)


@given(st.sampled_from(ALLOWED + PUBLIC_KAFKA), st.from_regex(r"[\w./:,-]{0,40}", fullmatch=True))
def test_allowed_settings_without_a_password_are_forwarded_as_they_are(name, value):
    assert forwarded_environment({name: value, "LAKEHOUSE_KAFKA_SASL_PASSWORD": "pw"}) == {name: value}


@given(password=st.text(min_size=1, max_size=30),
       unknown=st.from_regex(r"LAKEHOUSE_[A-Z0-9_]{1,30}", fullmatch=True).filter(lambda n: n not in ALLOWED),
       secret_property=st.sampled_from(sorted(config.SENSITIVE_KAFKA_PROPERTIES)))
def test_no_variable_that_holds_a_password_is_forwarded(password, unknown, secret_property):
    environ = {
        "LAKEHOUSE_CATALOG_URI": f"postgresql+psycopg2://iceberg:{password}@db:5432/iceberg",
        "LAKEHOUSE_WAREHOUSE": f"s3://lake:{quote(password, safe='')}@bucket/warehouse",
        "LAKEHOUSE_S3_ENDPOINT": f"http://minio:{password}@minio:9000",
        "LAKEHOUSE_KAFKA_SASL_USERNAME": f"postgresql://u@h/db?password={quote(password, safe='')}",
        config.KAFKA_PREFIX + secret_property.upper().replace(".", "_"): password,
        unknown: password,
    }
    assert forwarded_environment(environ) == {}


def test_the_public_kafka_properties_hold_no_secret_and_name_their_variables():
    for prop in config.PUBLIC_KAFKA_PROPERTIES:
        assert not config.is_sensitive_kafka_property(prop), prop
        assert not SECRET_NAME.search(prop.upper().replace(".", "_")), prop
        assert config.kafka_property(config.KAFKA_PREFIX + prop.upper().replace(".", "_")) == prop


def test_the_job_environment_lists_every_variable_the_jobs_read():
    """Besides config.ENVIRONMENT: every LAKEHOUSE_* name the modules name, but Airflow's own
    settings (lakehouse_dev.airflow_stack) and the supervision marker the operator sets itself."""
    sources = [p for folder in ("include/lakehouse", "spark_jobs") for p in (config.REPO_ROOT / folder).rglob("*.py")
               if p.name != "config.py"] + [config.REPO_ROOT / "tests" / "support" / "faults.py"]  # the fault hook jobs load
    named = {name for p in sources for name in re.findall(r"[\"'](LAKEHOUSE_[A-Z0-9_]*[A-Z0-9])[\"']", p.read_text())}
    # set by the operators themselves: supervision.SUPERVISED_ENV, events.AIRFLOW_RUN_ENV (the run's actor)
    not_for_jobs = {*airflow_stack.ENVIRONMENT, "LAKEHOUSE_SUPERVISED_PIPELINE", "LAKEHOUSE_AIRFLOW_RUN"}
    assert named - not_for_jobs <= set(ALLOWED)
    assert {n for n in config.JOB_ENVIRONMENT if n.startswith("LAKEHOUSE_")} <= named
    assert not set(config.JOB_ENVIRONMENT) & set(config.ENVIRONMENT)


# ---------------------------------------------------------------------------- reprs and messages

# printable ASCII but quotes and backslash, which repr() would escape
passwords = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="'\"\\"),
                    min_size=1, max_size=24).map(lambda p: "Zq9" + p)


@given(passwords, st.sampled_from(["raw", "quoted", "query"]))
def test_platform_and_catalog_config_never_show_the_catalog_password(password, form):
    uri = {"raw": f"postgresql+psycopg2://iceberg:{password}@pg:5432/iceberg",
           "quoted": f"postgresql+psycopg2://iceberg:{quote(password, safe='')}@pg:5432/iceberg",
           "query": f"postgresql+psycopg2://iceberg@pg:5432/iceberg?password={quote(password, safe='')}"}[form]
    secret = password if form == "raw" else quote(password, safe="")
    platform = config.PlatformConfig(home=Path("/srv/lake"), bootstrap_servers="kafka:9092",
                                     kafka_extra={"sasl.password": password}, catalog_uri=uri,
                                     warehouse="s3://lakehouse/warehouse",
                                     object_store=config.ObjectStoreConfig(endpoint=f"http://ak:{secret}@minio:9000"))
    catalog = platform.catalog("lake")
    for shown in (repr(platform), str(platform), repr(catalog), str(catalog), config.redact(uri)):
        assert secret not in shown and password not in shown, shown
    assert "pg:5432/iceberg" in repr(platform) and "pg:5432/iceberg" in repr(catalog)


def test_a_catalog_error_does_not_show_the_password():
    with pytest.raises(errors.ConfigurationError, match="unsupported database") as refused:
        config.CatalogConfig("lake", "jdbc", f"mysql://lake:{PASSWORD}@db/lake", "s3://b/w").jdbc()
    assert PASSWORD not in str(refused.value) and "mysql://lake:***@db/lake" in str(refused.value)
