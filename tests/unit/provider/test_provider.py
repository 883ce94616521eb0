"""The Airflow side as an installable provider (providers/lakehouse, distribution airflow-provider-lakehouse).

- Airflow finds it by its entry points alone: ProvidersManager lists it with its hooks, connection types
  (testable, with their forms), its page and its [lakehouse] configuration; the plugins manager loads the page.
- It builds as a wheel holding only its package and entry points, and that copy, away from the repository,
  generates the DAGs from the folders it is configured with.
- It finds specs, expectation suites and Spark jobs by configuration only (lakehouse_airflow.locations): the
  environment's variable, else [lakehouse] in Airflow's configuration, else an error naming both; no module of
  plugins/, dags/ or the provider looks for a file next to its own code.
- Each connection lays its settings over the environment's and reaches submitted jobs through their process
  environment; each hook's connection test answers (False, why) for a part that does not answer, and (end to
  end) True against the real part the `services` fixture runs, through the connection alone.

The unit half; the end-to-end half is tests/e2e/test_provider_e2e.py.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lakehouse_airflow
from lakehouse.core import config
from lakehouse.core.errors import ConfigurationError
from lakehouse_airflow import locations
from lakehouse_airflow.hooks.base import PartHook

REPO = config.REPO_ROOT
PROVIDER = REPO / "providers" / "lakehouse"
PACKAGE = "airflow-provider-lakehouse"
CONN_TYPES = {"lakehouse_kafka": "KafkaHook", "lakehouse_catalog": "CatalogHook",
              "lakehouse_object_store": "ObjectStoreHook", "lakehouse_schema_registry": "SchemaRegistryHook"}
FOLDER_VARIABLES = ("LAKEHOUSE_PIPELINES_DIR", "LAKEHOUSE_EXPECTATIONS_DIR", "LAKEHOUSE_SPARK_JOBS_DIR")


def connection(conn_id: str, **fields) -> str:
    """AIRFLOW_CONN_<ID>'s JSON of a connection; `extra` as a dict."""
    return json.dumps({**fields, "extra": json.dumps(fields.get("extra") or {})})


def airflow_test_of(monkeypatch, conn_id: str, **fields) -> tuple[bool, str]:
    """Airflow's own connection test of `fields` (as the API server's Test button and `airflow connections test`
    run it): the connection under `conn_id` in the environment, its hook found by conn_type through the
    ProvidersManager, `test_connection()` on it."""
    from airflow.models.connection import Connection

    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection(conn_id, **fields))
    extra = fields.pop("extra", None)
    return Connection(conn_id=conn_id, extra=json.dumps(extra) if extra else None, **fields).test_connection()


# ---------------------------------------------------------------------------- Airflow finds it

def test_airflow_finds_the_provider_its_testable_connection_types_its_page_and_its_settings():
    from airflow.configuration import retrieve_configuration_description
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert manager.providers[PACKAGE].version == lakehouse_airflow.__version__
    for conn_type, hook in CONN_TYPES.items():
        found = manager.hooks[conn_type]
        assert found.hook_class_name.endswith(f".{hook}") and found.package_name == PACKAGE, conn_type
        assert found.connection_testable and found.hook_name.startswith("Lakehouse: "), conn_type
        assert "hidden_fields" in manager.field_behaviours[conn_type]
    assert "extra__lakehouse_catalog__warehouse" in manager.connection_form_widgets
    assert manager.field_behaviours["lakehouse_kafka"]["relabeling"]["host"] == "Bootstrap servers"
    assert [(p.name, p.plugin_class) for p in manager.plugins if p.provider_name == PACKAGE] == \
        [("lakehouse_ui", "lakehouse_airflow.ui.LakehouseUIPlugin")]
    options = retrieve_configuration_description()["lakehouse"]["options"]
    assert set(options) == {"pipelines_dir", "expectations_dir", "spark_jobs_dir"}
    # the page registers itself from the entry point, without a file in a plugins folder
    entry_points = {(e.group, e.name): e.value for e in distribution(PACKAGE).entry_points}
    assert entry_points[("airflow.plugins", "lakehouse_ui")] == "lakehouse_airflow.ui:LakehouseUIPlugin"
    assert entry_points[("apache_airflow_provider", "provider_info")] == \
        "lakehouse_airflow.get_provider_info:get_provider_info"
    from airflow import plugins_manager

    [page] = [p for p in plugins_manager.get_plugin_info() if p["name"] == "lakehouse_ui"]
    assert "lakehouse_airflow.ui" in str(page["source"]) and page["fastapi_apps"][0]["url_prefix"] == "/lakehouse"
    assert plugins_manager.get_import_errors() == {}  # registered once: no "already registered" error


def test_the_provider_builds_into_a_wheel_whose_copy_away_from_the_repository_generates_the_dags(tmp_path):
    """Installed elsewhere (a wheel unpacked outside the repository, first on sys.path), the provider generates the
    DAGs from the folders it is configured with: specs, suites and jobs of its own, none of the repository's."""
    source = tmp_path / "source"  # pip builds in the source tree: a copy keeps build/ out of the repository
    shutil.copytree(PROVIDER, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation",
                            "--wheel-dir", str(tmp_path / "dist"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("airflow_provider_lakehouse-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        archive.extractall(tmp_path / "site")
    code = [n for n in names if ".dist-info/" not in n]
    assert "lakehouse_airflow/get_provider_info.py" in code and "lakehouse_airflow/hooks/kafka.py" in code
    assert all(n.startswith("lakehouse_airflow/") for n in code), code  # no dags/, plugins/, tests, specs
    assert "[apache_airflow_provider]" in entry_points and "[airflow.plugins]" in entry_points

    elsewhere = tmp_path / "deployment"
    (elsewhere / "pipelines").mkdir(parents=True)
    (elsewhere / "expectations").mkdir()
    (elsewhere / "jobs").mkdir()
    (elsewhere / "pipelines" / "orders.yaml").write_text((REPO / "include" / "pipelines" / "orders.yaml").read_text())
    for job in locations.JOBS:
        (elsewhere / "jobs" / f"{job}.py").write_text("")
    script = """
import json, lakehouse_airflow
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(%r)
ingest = bag.dags["orders_ingest"].tasks[0]
print(json.dumps({"module": lakehouse_airflow.__file__, "errors": {k: str(v) for k, v in bag.import_errors.items()},
                  "dags": sorted(bag.dag_ids), "application": ingest.application}))
""" % str(REPO / "dags")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "LAKEHOUSE_PIPELINES_DIR": str(elsewhere / "pipelines"),
           "LAKEHOUSE_EXPECTATIONS_DIR": str(elsewhere / "expectations"),
           "LAKEHOUSE_SPARK_JOBS_DIR": str(elsewhere / "jobs")}
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found["module"] == str(tmp_path / "site" / "lakehouse_airflow" / "__init__.py")
    assert found["errors"] == {}
    assert "orders_ingest" in found["dags"] and not any(d.startswith("customers_") for d in found["dags"])
    assert found["application"] == str(elsewhere / "jobs" / "ingest.py")


# ---------------------------------------------------------------------------- files found by configuration

def _python_files() -> list[Path]:
    return sorted(p for folder in (REPO / "plugins", REPO / "dags", PROVIDER) for p in folder.rglob("*.py"))


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_airflow_module_finds_files_through_the_location_of_its_code(path):
    """Neither __file__ nor a path derived from it (lakehouse.core.config.REPO_ROOT, Path.parents): specs,
    expectation suites and Spark jobs are where the configuration says (lakehouse_airflow.locations)."""
    tree = ast.parse(path.read_text(), str(path))
    found = [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
             if (isinstance(node, ast.Name) and node.id in ("__file__", "REPO_ROOT"))
             or (isinstance(node, ast.Attribute) and node.attr in ("__file__", "REPO_ROOT", "parents"))
             or (isinstance(node, ast.ImportFrom) and any(a.name == "REPO_ROOT" for a in node.names))]
    assert found == [], f"{path.relative_to(REPO)} finds files by its own location: {found}"


def test_the_airflow_modules_are_checked_where_they_are_installed_from():
    assert Path(lakehouse_airflow.__file__).parent == PROVIDER / "lakehouse_airflow"
    assert [p for p in _python_files() if p.parent == REPO / "plugins"] == []  # the page comes from the provider
    assert len([p for p in _python_files() if PROVIDER in p.parents]) >= 20


@pytest.fixture
def unconfigured(monkeypatch):
    """No folder configured: neither the variables nor Airflow's [lakehouse] options."""
    for variable in FOLDER_VARIABLES:
        monkeypatch.setenv(variable, "")  # empty counts as unset (and is restored after the test)
    for location in locations.LOCATIONS:
        monkeypatch.delenv(f"AIRFLOW__LAKEHOUSE__{location.option.upper()}", raising=False)


@pytest.mark.parametrize("location", locations.LOCATIONS, ids=lambda loc: loc.option)
def test_a_folder_nobody_configured_is_an_error_naming_both_ways_to_set_it(unconfigured, location):
    with pytest.raises(ConfigurationError) as refused:
        location.path()
    message = str(refused.value)
    assert location.variable in message and f"[lakehouse] {location.option}" in message
    assert f"AIRFLOW__LAKEHOUSE__{location.option.upper()}" in message


def test_airflow_configuration_sets_a_folder_the_library_and_submitted_jobs_then_read(unconfigured, monkeypatch,
                                                                                      tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    monkeypatch.setenv("AIRFLOW__LAKEHOUSE__PIPELINES_DIR", str(specs))
    assert locations.pipelines_dir() == specs.resolve()
    # put into this process's environment, where the product library and spark-submit read it
    assert os.environ["LAKEHOUSE_PIPELINES_DIR"] == str(specs)
    assert config.pipelines_dir() == specs.resolve()
    # the environment's variable wins over Airflow's configuration
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(other))
    assert locations.pipelines_dir() == other.resolve()


def test_a_configured_folder_must_exist_and_hold_the_spark_jobs(monkeypatch, tmp_path):
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match=r"LAKEHOUSE_PIPELINES_DIR='.*missing' is not a folder"):
        locations.pipelines_dir()
    monkeypatch.setenv("LAKEHOUSE_SPARK_JOBS_DIR", str(tmp_path))
    with pytest.raises(ConfigurationError, match=r"holds no ingest\.py"):
        locations.spark_job("ingest")
    (tmp_path / "ingest.py").write_text("")
    assert locations.spark_job("ingest") == str(tmp_path / "ingest.py")
    # a URL spark-submit fetches the application from is taken as given
    monkeypatch.setenv("LAKEHOUSE_SPARK_JOBS_DIR", "s3://jobs-bucket/lakehouse/")
    assert locations.spark_job("maintenance") == "s3://jobs-bucket/lakehouse/maintenance.py"
    with pytest.raises(ValueError, match="unknown Spark job"):
        locations.spark_job("../../etc/passwd")


def test_without_a_configured_pipelines_folder_only_the_specs_file_fails_to_import_and_says_why(unconfigured,
                                                                                              monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("LAKEHOUSE_SPARK_JOBS_DIR", str(REPO / "spark_jobs"))
    bag = DagBag(str(REPO / "dags"))
    assert set(bag.import_errors) == {str(REPO / "dags" / "lakehouse_specs.py")}
    assert "LAKEHOUSE_PIPELINES_DIR" in bag.import_errors[str(REPO / "dags" / "lakehouse_specs.py")]
    assert not any(d.startswith("orders_") for d in bag.dag_ids)  # no pipeline guessed from the repository

    # the specs configured, the Spark jobs not: the DAG files that submit jobs say which setting is missing
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(REPO / "include" / "pipelines"))
    monkeypatch.setenv("LAKEHOUSE_SPARK_JOBS_DIR", "")
    bag = DagBag(str(REPO / "dags"))
    assert {Path(f).name for f in bag.import_errors} == {"lakehouse_ingest.py", "lakehouse_maintenance.py",
                                                         "lakehouse_backfill.py"}
    assert all("LAKEHOUSE_SPARK_JOBS_DIR" in e for e in bag.import_errors.values())


# ---------------------------------------------------------------------------- connections over the environment

CATALOG = {"conn_type": "lakehouse_catalog", "host": "postgresql+psycopg2://db.internal:5432/iceberg",
           "login": "ice berg", "password": "p@ss:w/rd#1", "extra": {"warehouse": "s3://lake/warehouse"}}
STORE = {"conn_type": "lakehouse_object_store", "host": "http://minio.internal:9000", "login": "AKIDEXAMPLE",
         "password": "s3cr3t/key+", "extra": {"region": "eu-west-1", "path_style_access": True}}


def test_catalog_and_object_store_connections_win_over_the_environment_and_reach_jobs_by_their_environment(
        make_spec, monkeypatch):
    from lakehouse_airflow.hooks import LakehouseHook, connection_environment
    from lakehouse_airflow.spark import submit_kwargs

    spec = make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", "sqlite:////nowhere/catalog.db")
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT", "http://from-the-environment:9000")
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_CATALOG", connection("lakehouse_catalog", **CATALOG))
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_OBJECT_STORE", connection("lakehouse_object_store", **STORE))
    platform = LakehouseHook(spec.name).platform
    catalog = platform.catalog(spec.catalog)
    assert catalog.jdbc() == ("jdbc:postgresql://db.internal:5432/iceberg",
                              {"user": "ice berg", "password": "p@ss:w/rd#1"})
    assert platform.warehouse == "s3://lake/warehouse" and catalog.warehouse == "s3://lake/warehouse/lake"  # per catalog
    store = platform.object_store
    assert (store.endpoint, store.region, store.path_style_access) == ("http://minio.internal:9000", "eu-west-1", True)
    assert catalog.pyiceberg_properties()["s3.secret-access-key"] == "s3cr3t/key+"
    assert "p@ss" not in repr(platform) and "s3cr3t" not in repr(platform)

    env = connection_environment()
    assert config.load().with_kafka({}) is not None  # the environment itself still loads
    assert env["LAKEHOUSE_WAREHOUSE"] == "s3://lake/warehouse"
    assert env["LAKEHOUSE_S3_ENDPOINT"] == "http://minio.internal:9000" and env["LAKEHOUSE_S3_REGION"] == "eu-west-1"
    assert env["LAKEHOUSE_S3_PATH_STYLE_ACCESS"] == "true"
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AKIDEXAMPLE", "s3cr3t/key+")
    # a job started with that environment reads the connection's catalog, password included
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", env["LAKEHOUSE_CATALOG_URI"])
    assert config.load(fresh=True).catalog(spec.catalog).jdbc()[1]["password"] == "p@ss:w/rd#1"
    # templated fields (rendered, stored, shown in the UI) never hold them
    kwargs = json.dumps(submit_kwargs(spec, "ingest", "--once"))
    assert "p@ss" not in kwargs and "s3cr3t" not in kwargs and "AKIDEXAMPLE" not in kwargs


@given(settings=st.dictionaries(st.from_regex(r"[a-z]{2,12}(\.[a-z]{2,12}){0,3}", fullmatch=True)
                                .filter(lambda p: p != "bootstrap.servers"),
                                st.text(min_size=1, max_size=30).filter(lambda v: "\x00" not in v), max_size=6))
def test_the_kafka_settings_a_connection_hands_a_job_are_the_settings_the_job_reads(settings):
    """kafka_environment (what a Kafka connection gives spark-submit) and config.load's LAKEHOUSE_KAFKA_* reading
    are inverses: the job's librdkafka gets the connection's properties, secrets included, exactly."""
    from lakehouse_airflow.hooks import kafka_environment

    env = kafka_environment({"bootstrap.servers": "broker.internal:9093", **settings})
    assert env.pop("LAKEHOUSE_BOOTSTRAP_SERVERS") == "broker.internal:9093"
    assert {config.kafka_property(name): value for name, value in env.items()} == settings


@given(login=st.text(min_size=1, max_size=20).filter(lambda s: s.strip() and "\x00" not in s),
       password=st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s))
def test_any_database_user_and_password_of_a_catalog_connection_reach_the_catalog_as_given(login, password):
    from airflow.models.connection import Connection

    from lakehouse_airflow.hooks.catalog import CatalogHook

    conn = Connection(conn_id="c", conn_type="lakehouse_catalog", host="postgresql+psycopg2://db:5432/iceberg",
                      login=login, password=password)
    platform = CatalogHook.lay_over(config.PlatformConfig(home=Path("/tmp"), bootstrap_servers="b:9092"), conn)
    assert platform.catalog("lake").jdbc()[1] == {"user": login, "password": password}


@pytest.mark.parametrize(("fields", "refusal"), [
    ({"conn_type": "lakehouse_catalog", "host": "db.internal:5432"}, "is not a catalog URI"),
    ({"conn_type": "lakehouse_catalog", "host": "mysql://db/iceberg"}, "is not a catalog URI"),
    ({"conn_type": "lakehouse_catalog", "host": "sqlite:////srv/catalog.db", "login": "x"}, "names no server"),
    ({"conn_type": "lakehouse_object_store", "host": "minio:9000"}, "is not the object store's endpoint URL"),
    ({"conn_type": "lakehouse_object_store", "host": "http://minio:9000", "extra": {"path_style_access": "maybe"}},
     "path_style_access 'maybe': expected true or false"),
    ({"conn_type": "lakehouse_schema_registry", "host": "ftp://registry"}, "is not the registry's http(s) URL"),
])
def test_a_connection_that_cannot_be_used_fails_its_test_and_its_tasks_naming_the_field(monkeypatch, make_spec,
                                                                                         fields, refusal):
    from lakehouse_airflow.hooks import LakehouseHook

    conn_id = fields["conn_type"]  # the id the operators look for
    ok, message = airflow_test_of(monkeypatch, conn_id, **dict(fields))
    assert not ok and refusal in message and repr(conn_id) in message
    spec = make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    with pytest.raises(ConfigurationError, match=re.escape(refusal)):
        LakehouseHook(spec.name).submit_environment


def test_no_connection_leaves_the_environment_as_it_is(make_spec, monkeypatch):
    from lakehouse_airflow.hooks import CatalogHook, LakehouseHook, connection_environment

    spec = make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    for conn_id in CONN_TYPES:
        monkeypatch.delenv(f"AIRFLOW_CONN_{conn_id.upper()}", raising=False)
    hook = LakehouseHook(spec.name)
    assert hook.platform == config.load() and hook.submit_environment == {} and connection_environment() == {}
    ok, message = CatalogHook().test_connection()
    assert not ok and message == "there is no Airflow connection 'lakehouse_catalog' to test"


# ---------------------------------------------------------------------------- connection tests against closed ports

@pytest.mark.parametrize("conn_type", sorted(CONN_TYPES))
def test_each_connection_test_answers_false_with_the_reason_when_nothing_listens(monkeypatch, free_tcp_port,
                                                                                 conn_type):
    monkeypatch.setattr(PartHook, "TEST_TIMEOUT_S", 3.0)
    closed = f"127.0.0.1:{free_tcp_port}"
    monkeypatch.setenv("LAKEHOUSE_WAREHOUSE", "s3://lakehouse/warehouse")  # the warehouse the store would hold
    fields = {
        "lakehouse_kafka": {"host": closed},
        "lakehouse_catalog": {"host": f"http://{closed}"},
        "lakehouse_object_store": {"host": f"http://{closed}", "login": "AKIDCLOSED", "password": "closed-secret",
                                   "extra": {"region": "us-east-1", "path_style_access": True}},
        "lakehouse_schema_registry": {"host": f"http://{closed}", "login": "lakehouse", "password": "closed-secret"},
    }[conn_type]
    ok, message = airflow_test_of(monkeypatch, f"probe_{conn_type}", conn_type=conn_type, **fields)
    assert ok is False
    assert closed in message, message  # says where it looked
    assert f"Check the connection 'probe_{conn_type}'" in message  # and what to correct
    assert "closed-secret" not in message
    reasons = {"lakehouse_kafka": "Kafka is unreachable", "lakehouse_catalog": "is unavailable",
               "lakehouse_object_store": "nothing answers", "lakehouse_schema_registry": "connection refused"}
    assert reasons[conn_type].lower() in message.lower(), message


# ---------------------------------------------------------------------------- end to end: the real parts


