"""docker-compose.yaml and docker/, checked without Docker (none runs on the project's machines).

The file is read as data: which services exist, that images are pinned, that every
long-running service has a healthcheck and every service waits for the ones it talks to,
that ports are published on loopback only, that no secret is written in it and every
variable it interpolates is in .env.example, that every setting it gives is one something
reads (config.py, Airflow, Spark, the AWS SDKs, the docker/ scripts), and that the addresses
in the settings name the services and ports declared. The scripts of docker/ run here
against local stand-ins: a throwaway PostgreSQL cluster, a fake Spark master, a fake REST catalog.

Compose and the development stack agree (the last section): the images are the versions the stack
runs (the POMs of devstack/jvm, lakehouse.core.config, the PostgreSQL the tests run), and each
server gets the settings the stack gives its own (lakehouse_dev.kafka_broker, rest_catalog, registry,
object_store), but for the deliberate differences listed there, each with its reason.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import importlib.util
import json
import os
import re
import shlex
import sqlite3
import stat
import subprocess
import threading
import tomllib
import types
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit
from xml.etree import ElementTree

import pytest
import yaml
from pgserver import PostgresMissing
from pgserver import bin_dir as postgres_bin_dir
from pgserver import cluster as postgres_cluster

from lakehouse.core import config
from lakehouse_airflow import spark as airflow_spark
from lakehouse_dev import airflow_stack, kafka_broker, object_store, processes, registry, rest_catalog, services

REPO = config.REPO_ROOT
DOCKER = REPO / "docker"
COMPOSE = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
SERVICES: dict[str, dict] = COMPOSE["services"]
DOCKERFILE = (DOCKER / "Dockerfile").read_text()
APP_ROOT = "/opt/lakehouse/app"  # where docker/Dockerfile puts the repository
JARS_DIR = "/opt/lakehouse/jars"
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
REQUIRED_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*):\?[^}]+\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|_KEY|TOKEN")
PINNED_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/-]*:(?!latest$)v?\d+\.\d+(?:\.\d+)?(?:-[\w.]+)?")
EXPECTED_SERVICES = {"kafka", "postgres", "object-store", "iceberg-rest", "schema-registry", "spark-master",
                     "spark-worker", "airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
                     "airflow-triggerer"}
# Variables of third-party images, by image name: what their documentation says they read.
IMAGE_VARIABLES = {
    "apache/kafka": ("KAFKA_", "CLUSTER_ID"),  # KAFKA_FOO_BAR: server property foo.bar (kafka_setting)
    "postgres": ("POSTGRES_",),
    # RESTCatalogServer: CATALOG_* are catalog properties (rest_catalog.property_name); AWS_* the AWS SDK's
    # (S3FileIO); REST_PORT the image's own healthcheck's port
    "apache/iceberg-rest-fixture": ("CATALOG_", "AWS_", "REST_"),
    # Quarkus and Apicurio: every configuration property as an environment variable (quarkus_variable)
    "apicurio/apicurio-registry": ("APICURIO_", "QUARKUS_"),
}
# Process-level variables of the project image and who reads them.
PROCESS_VARIABLES = {
    "AIRFLOW_HOME": "Airflow",
    "PYSPARK_PYTHON": "PySpark, lakehouse.core.sparkenv", "PYSPARK_DRIVER_PYTHON": "PySpark",
    "PYTHONDONTWRITEBYTECODE": "Python", "PYTHONUNBUFFERED": "Python", "DEBIAN_FRONTEND": "apt",
    # the AWS SDKs' default credential chain (S3FileIO on the JVM, pyarrow in pyiceberg)
    "AWS_ACCESS_KEY_ID": "AWS SDK", "AWS_SECRET_ACCESS_KEY": "AWS SDK",
}
# LAKEHOUSE_* settings something reads: config.py, and the Spark jobs (the allow-list Airflow forwards).
PLATFORM_SETTINGS = config.ENVIRONMENT + config.JOB_ENVIRONMENT
# Spark daemon variables, each checked against the Spark class that reads it.
SPARK_VARIABLES = {
    "SPARK_WORKER_CORES": "org/apache/spark/deploy/worker/WorkerArguments.class",
    "SPARK_WORKER_MEMORY": "org/apache/spark/deploy/worker/WorkerArguments.class",
    "SPARK_WORKER_DIR": "org/apache/spark/deploy/worker/WorkerArguments.class",
    "SPARK_LOCAL_HOSTNAME": "org/apache/spark/util/Utils$.class",
}


# ---------------------------------------------------------------------------- reading the files

def environment(service: str) -> dict[str, str]:
    env = SERVICES[service].get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def words(value) -> list[str]:
    """A command, entrypoint or healthcheck test as a list of words."""
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def service_text(service: str) -> str:
    """Everything a service is told: environment values, command, entrypoint and healthcheck."""
    spec = SERVICES[service]
    parts = [*environment(service).values(), *words(spec.get("command")), *words(spec.get("entrypoint")),
             *words((spec.get("healthcheck") or {}).get("test"))]
    return "\n".join(parts)


def all_values(node) -> list[str]:
    """Every scalar of the parsed compose file (services and volumes)."""
    if isinstance(node, dict):
        return [v for key, value in node.items() for v in all_values(value)]
    if isinstance(node, list):
        return [v for item in node for v in all_values(item)]
    return [] if node is None else [str(node)]


def env_example() -> dict[str, str]:
    values = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def one_shot(service: str) -> bool:
    return str(SERVICES[service].get("restart")) == "no"


def depends_on(service: str) -> dict[str, str]:
    deps = SERVICES[service].get("depends_on") or {}
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def waits_for(service: str) -> set[str]:
    """Every service `service` starts after, directly or through its dependencies."""
    seen: set[str] = set()
    todo = list(depends_on(service))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(depends_on(name))
    return seen


def listening_ports(service: str) -> set[int]:
    """The container ports `service` listens on, from its command or its image's settings."""
    if service == "postgres":
        return {5432}  # the image's default; PGPORT is not set
    if service == "kafka":
        return {int(p) for p in re.findall(r"://[^,]*:(\d+)", environment("kafka")["KAFKA_LISTENERS"])}
    if service == "iceberg-rest":
        return {int(environment(service)["CATALOG_REST_PORT"])}  # catalog property rest.port
    if service == "schema-registry":
        return {8080, 9000}  # the image's defaults: Quarkus's HTTP port and its management interface
    ports, args = set(), words(SERVICES[service].get("command"))
    for flag, value in zip(args, args[1:]):
        if flag in ("--port", "--webui-port"):
            ports.add(int(value))
        elif flag in ("--address", "--console-address"):
            ports.add(int(value.rsplit(":", 1)[1]))
    return ports


def addresses(text: str) -> list[tuple[str, int]]:
    """(service, port) for every `<service>:<port>` the text names."""
    found = []
    for name in SERVICES:
        found += [(name, int(port)) for port in re.findall(rf"(?<![\w.-]){re.escape(name)}:(\d+)", text)]
    return found


def project_services() -> list[str]:
    return [name for name, spec in SERVICES.items() if "build" in spec]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
            for line in lines if line and not line.startswith("#")]


def dockerfile_pairs(instruction: str) -> dict[str, str]:
    """KEY=VALUE pairs of every ENV (or ARG) instruction (an ARG a build stage declares again without a value
    keeps the value it was given before its first FROM)."""
    pairs = {}
    for name, args in dockerfile_instructions():
        if name == instruction:
            for item in shlex.split(args):
                key, equals, value = item.partition("=")
                if equals or key not in pairs:
                    pairs[key] = value
    return pairs


def names_read_by(script: Path) -> set[str]:
    """Environment variables a docker/ script reads."""
    text = script.read_text()
    if script.suffix == ".py":
        return set(re.findall(r"os\.environ(?:\.get\(|\[)\"([A-Z][A-Z0-9_]*)\"", text))
    return set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", text)) | set(re.findall(r"\\getenv \w+ ([A-Z][A-Z0-9_]*)", text))


def scripts_of(service: str) -> list[Path]:
    """The docker/ scripts a service runs: bind-mounted from ./docker, or run from the image's copy."""
    spec = SERVICES[service]
    paths = [REPO / v.split(":")[0] for v in spec.get("volumes") or [] if v.startswith("./docker/")]
    for word in words(spec.get("command")):
        if word.startswith(f"{APP_ROOT}/docker/"):
            script = REPO / word[len(APP_ROOT) + 1:]
            paths.append(script)
            # a shell script's python helpers next to it
            paths += [REPO / "docker" / m for m in re.findall(r"/([\w-]+\.py)", script.read_text())]
    return paths


def image_name(service: str) -> str:
    return SERVICES[service]["image"].rsplit(":", 1)[0]


def image_tag(image: str) -> str:
    """The tag of the one service running `image` (a name without tag)."""
    [tag] = [spec["image"].rsplit(":", 1)[1] for spec in SERVICES.values() if spec["image"].rsplit(":", 1)[0] == image]
    return tag


def runs_module(service: str, module: str) -> bool:
    """Whether `service`'s command is `python -m <module> ...`."""
    return words(SERVICES[service].get("command"))[:3] == ["python", "-m", module]


def reads(service: str, key: str) -> bool:
    """Whether a project service's variable `key` is read by the development stack module it runs."""
    return runs_module(service, object_store.MODULE) and key in object_store.ENVIRONMENT


# ---------------------------------------------------------------------------- services and images

def test_the_stack_is_kafka_the_rest_catalog_an_s3_server_the_registry_postgres_spark_and_airflow():
    assert set(SERVICES) == EXPECTED_SERVICES


def test_every_image_is_pinned_to_an_exact_version():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name, spec in SERVICES.items():
        assert PINNED_IMAGE.fullmatch(spec["image"]), f"{name}: image {spec['image']!r} is not pinned"
        if "build" in spec:
            assert spec["image"] == f"lakehouse-platform:{version}", name
            assert spec["build"] == {"context": ".", "dockerfile": "docker/Dockerfile"}, name


def test_the_project_image_builds_from_a_pinned_python_with_the_locked_requirements():
    froms = [args for name, args in dockerfile_instructions() if name == "FROM"]
    # a build stage resolves the Spark packages with Maven; the image itself is Python
    assert len(froms) == 2 and re.fullmatch(r"maven:3\.9\.\d+-eclipse-temurin-17 AS packages", froms[0])
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", froms[1])
    assert ("WORKDIR", APP_ROOT) in dockerfile_instructions()
    runs = " ".join(args for name, args in dockerfile_instructions() if name == "RUN")
    # every download hash-checked from the lock, as set-up installs it (the rest offline)
    pip_installs = re.findall(r"pip install [^&]*", runs)
    assert pip_installs and all("--require-hashes" in c or "--no-index" in c for c in pip_installs), pip_installs
    assert "pip install --no-cache-dir --require-hashes --no-build-isolation -r requirements.lock" in runs
    # editable, as scripts/setup.sh installs it: lakehouse.core.config.REPO_ROOT is then APP_ROOT; and the
    # development stack's package, whose S3 server the object-store service runs
    assert "pip install --no-cache-dir --no-deps --no-index --no-build-isolation -e ." in runs
    assert "pip install --no-cache-dir --no-deps --no-index --no-build-isolation -e devstack" in runs
    assert "-e devstack" in (REPO / "scripts/setup.sh").read_text()
    # the Airflow provider, as set-up installs it: Airflow finds its hooks and page through its entry points
    assert "pip install --no-cache-dir --no-deps --no-index --no-build-isolation -e providers/lakehouse" in runs
    assert "-e providers/lakehouse" in (REPO / "scripts/setup.sh").read_text()
    setup_pip = re.search(r'^PIP_VERSION="([^"]+)"', (REPO / "scripts/setup.sh").read_text(), re.M).group(1)
    assert dockerfile_pairs("ARG")["PIP_VERSION"] == setup_pip


def test_the_image_resolves_the_spark_packages_the_project_is_tested_with():
    import pyspark

    runtime = next(c for c in config.SPARK_PACKAGES if ":iceberg-spark-runtime-" in c)
    spark, scala, iceberg = re.fullmatch(r"org\.apache\.iceberg:iceberg-spark-runtime-(\d+\.\d+)_(\d+\.\d+):(\S+)",
                                         runtime).groups()
    assert iceberg == config.ICEBERG_VERSION
    assert pyspark.__version__.startswith(spark + ".")
    shipped_scala = [p.name for p in (Path(pyspark.__file__).parent / "jars").glob("scala-library-*.jar")]
    assert shipped_scala and shipped_scala[0].startswith(f"scala-library-{scala}.")
    assert tuple(dockerfile_pairs("ARG")["SPARK_PACKAGES"].split()) == config.SPARK_PACKAGES
    # resolved as set-up resolves them, into the Maven repository Spark's Ivy reads, with checksums enforced
    runs = [args for name, args in dockerfile_instructions() if name == "RUN"]
    assert any("mvn -B -q -C -s /tmp/settings.xml dependency:get" in run for run in runs)
    assert ("COPY", "--from=packages --chown=50000:0 /root/.m2/repository /home/lakehouse/.m2/repository") \
        in dockerfile_instructions()
    assert "LAKEHOUSE_JARS" not in dockerfile_pairs("ENV")


def test_named_volumes_of_the_project_image_start_owned_by_its_user():
    """A named volume starts with the ownership of the folder it is mounted on: each must exist in the image,
    owned by the unprivileged user the image runs as."""
    assert ("USER", "50000") in dockerfile_instructions()
    runs = [args for name, args in dockerfile_instructions() if name == "RUN"]
    def folders(command: str) -> list[str]:
        return [w for run in runs for part in run.split("&&") if part.strip().startswith(command)
                for w in part.split() if w.startswith("/")]

    created, owned = folders("mkdir -p"), folders("chown -R 50000:0")
    for name in project_services():
        for volume in SERVICES[name].get("volumes") or []:
            source, target = volume.split(":")[:2]
            if source in COMPOSE["volumes"]:
                assert any(p == target or target.startswith(p + "/") for p in created), f"{name}: {target}"
                assert any(p == target or target.startswith(p + "/") for p in owned), f"{name}: {target}"


# ---------------------------------------------------------------------------- health and start order

def test_every_long_running_service_has_a_healthcheck_and_restarts():
    for name, spec in SERVICES.items():
        if one_shot(name):
            assert "healthcheck" not in spec, f"one-shot {name} never becomes healthy"
        else:
            assert words(spec.get("healthcheck", {}).get("test")), f"{name} has no healthcheck"
            assert spec.get("restart") == "unless-stopped", name


def test_services_start_once_their_dependencies_are_healthy_or_done():
    for name in SERVICES:
        for dependency, condition in depends_on(name).items():
            expected = "service_completed_successfully" if one_shot(dependency) else "service_healthy"
            assert condition == expected, f"{name} -> {dependency}: {condition}"


def test_every_one_shot_is_awaited_by_a_long_running_service():
    # otherwise `docker compose up --wait` reports the one-shot's exit as a failure
    for name in filter(one_shot, SERVICES):
        assert any(depends_on(other).get(name) == "service_completed_successfully"
                   for other in SERVICES if not one_shot(other)), name


def test_every_service_waits_for_the_services_it_talks_to():
    for name in SERVICES:
        for other, _ in addresses(service_text(name)):
            if other != name:
                assert other in waits_for(name), f"{name} talks to {other} without waiting for it"


def test_every_address_names_a_port_its_service_listens_on():
    for name in SERVICES:
        for other, port in addresses(service_text(name)):
            assert port in listening_ports(other), f"{name} calls {other}:{port}"
        for url_port in re.findall(r"http://localhost:(\d+)", service_text(name)):
            assert int(url_port) in listening_ports(name), f"{name} checks its own port {url_port}"


def test_ports_are_published_on_loopback_only_to_ports_the_services_listen_on():
    published = 0
    for name, spec in SERVICES.items():
        for mapping in spec.get("ports") or []:
            host_ip, _host_port, container_port = VAR.sub("0", str(mapping)).split(":")
            assert host_ip == "127.0.0.1", f"{name} publishes {mapping} beyond this machine"
            assert int(container_port) in listening_ports(name), f"{name}: {mapping}"
            published += 1
    assert published >= 6


# ---------------------------------------------------------------------------- secrets and variables

def test_no_secret_is_written_in_the_file():
    for name in SERVICES:
        for key, value in environment(name).items():
            if SECRET_NAME.search(key) and key.endswith("_FILE"):
                assert value.startswith("/"), f"{name}: {key} is a path to a secret"
            elif SECRET_NAME.search(key):
                assert REQUIRED_VAR.fullmatch(value), f"{name}: {key} must be ${{VAR:?...}} from .env"
            for password in re.findall(r"://[^/:@\s]+:(\$\{[^}]*\}|[^@\s/]+)@", value):
                assert REQUIRED_VAR.fullmatch(password), f"{name}: {key} carries a literal password"
    for key in dockerfile_pairs("ENV"):
        assert not SECRET_NAME.search(key), f"docker/Dockerfile bakes {key} into the image"


def test_env_example_lists_exactly_the_variables_the_file_uses():
    example = env_example()
    uses = [m for value in all_values(COMPOSE) for m in VAR.finditer(value)]
    assert {m.group(1) for m in uses} == set(example)
    for m in uses:
        if m.group(2) == ":-":  # a default here must be the value .env.example suggests
            assert example[m.group(1)] == m.group(3), m.group(0)
    for name, value in example.items():
        if SECRET_NAME.search(name):
            assert value == "", f".env.example must leave {name} for the user to choose"
            assert any(m.group(1) == name and m.group(2) == ":?" for m in uses), f"{name} is not required"


def test_secrets_stay_out_of_git_and_out_of_the_image():
    assert ".env" in (REPO / ".gitignore").read_text().splitlines()
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert ".env" in ignored and ".git" in ignored and ".lakehouse" in ignored


def test_lakehouse_settings_are_the_ones_config_reads():
    settings = [(name, key) for name in SERVICES for key in environment(name)] + \
        [("docker/Dockerfile", key) for key in dockerfile_pairs("ENV")]
    for name, key in settings:
        if key.startswith("LAKEHOUSE_"):
            assert key in PLATFORM_SETTINGS or key.startswith(config.KAFKA_PREFIX) or \
                (name in SERVICES and reads(name, key)), f"{name}: {key}"


def test_settings_kept_out_of_airflow_templated_fields_reach_spark_submit_from_the_task_runner():
    """submit_kwargs forwards only the allow-list into env_vars (rendered and stored by Airflow), from
    the DAG processor's environment; what it withholds, the registry URL with its password first of all,
    must be in the environment of the container that runs the tasks, which spark-submit inherits."""
    parsing, running = environment("airflow-dag-processor"), environment("airflow-scheduler")
    assert running["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"  # tasks run in the scheduler container
    withheld = {key for key, value in parsing.items()
                if key.startswith("LAKEHOUSE_") and not airflow_spark.forwardable(key, VAR.sub("pw", value))}
    assert "LAKEHOUSE_SCHEMA_REGISTRY_URL" in withheld
    for key in withheld:
        assert running.get(key) == parsing[key], f"airflow-scheduler does not get {key}"


def test_config_environment_lists_every_variable_config_reads():
    source = Path(config.__file__).read_text()
    read = set(re.findall(r"os\.environ(?:\.get\(|\[)[\"'](LAKEHOUSE_[A-Z0-9_]+)[\"']", source))
    assert read == set(config.ENVIRONMENT)
    assert all(name in config.__doc__ for name in config.ENVIRONMENT)
    assert "AWS_ACCESS_KEY_ID" in config.__doc__ and "AWS_SECRET_ACCESS_KEY" in config.__doc__


@functools.lru_cache(maxsize=None)
def _spark_reads(variable: str) -> bool:
    """Whether the Spark class known to read `variable` (SPARK_VARIABLES) names it."""
    import zipfile

    import pyspark

    core = next((Path(pyspark.__file__).parent / "jars").glob("spark-core_*.jar"))
    with zipfile.ZipFile(core) as jar:
        return variable.encode() in jar.read(SPARK_VARIABLES[variable])


def test_every_variable_a_project_service_gets_is_read_by_something():
    from airflow.configuration import retrieve_configuration_description

    airflow_options = retrieve_configuration_description()
    for name in project_services():
        scripts = set().union(*[names_read_by(p) for p in scripts_of(name)]) if scripts_of(name) else set()
        for key in environment(name):
            if key.startswith("AIRFLOW__"):
                section, option = key[len("AIRFLOW__"):].lower().split("__", 1)
                assert option in airflow_options.get(section, {}).get("options", {}), f"{name}: {key}"
            elif key.startswith("AIRFLOW_CONN_"):
                assert key[len("AIRFLOW_CONN_"):].lower() == airflow_spark.CONN_ID, key
            elif key.startswith("LAKEHOUSE_"):
                assert key in PLATFORM_SETTINGS or reads(name, key), f"{name}: {key}"
            elif key in SPARK_VARIABLES:
                assert _spark_reads(key), key
            else:
                assert key in PROCESS_VARIABLES or key in scripts, f"{name}: nothing reads {key}"
    for key in dockerfile_pairs("ENV"):
        assert (key in config.ENVIRONMENT or key in PROCESS_VARIABLES
                or (key in SPARK_VARIABLES and _spark_reads(key))), f"docker/Dockerfile: nothing reads {key}"


def test_third_party_services_get_only_their_images_variables_or_their_scripts():
    for name in set(SERVICES) - set(project_services()):
        prefixes = IMAGE_VARIABLES[image_name(name)]
        scripts = set().union(set(), *[names_read_by(p) for p in scripts_of(name)])
        for key in environment(name):
            assert key.startswith(prefixes) or key in scripts, f"{name}: nothing reads {key}"


# ---------------------------------------------------------------------------- consistent addresses

def platform_env() -> dict[str, str]:
    return environment("airflow-scheduler")


def test_kafka_advertises_the_bootstrap_servers_containers_use():
    kafka = environment("kafka")
    bootstrap = platform_env()["LAKEHOUSE_BOOTSTRAP_SERVERS"]
    advertised = dict(item.split("://") for item in kafka["KAFKA_ADVERTISED_LISTENERS"].split(","))
    listener = next(name for name, address in advertised.items() if address == bootstrap)
    assert f"{listener}://:{bootstrap.split(':')[1]}" in kafka["KAFKA_LISTENERS"].split(",")
    protocols = dict(item.split(":") for item in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols[listener] == "PLAINTEXT"  # the platform sets no LAKEHOUSE_KAFKA_SECURITY_PROTOCOL
    assert bootstrap in service_text("kafka")  # the healthcheck asks that very listener


def database_logins() -> dict[str, tuple[str, str, str, int, str]]:
    """{consumer: (user, password variable, host, port, database)} of every PostgreSQL login: Airflow's
    SQLAlchemy URL and the registry's datasource."""
    url = re.compile(r"postgresql\+psycopg2://(\w+):\$\{(\w+):\?[^}]*\}@([\w-]+):(\d+)/(\w+)")
    user, var, host, port, db = url.fullmatch(platform_env()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).groups()
    logins = {"airflow": (user, var, host, int(port), db)}
    apicurio = environment("schema-registry")
    jdbc = re.compile(r"jdbc:postgresql://([\w-]+):(\d+)/(\w+)")
    host, port, db = jdbc.fullmatch(apicurio["APICURIO_DATASOURCE_URL"]).groups()
    password_var = REQUIRED_VAR.fullmatch(apicurio["APICURIO_DATASOURCE_PASSWORD"]).group(1)
    logins["registry"] = (apicurio["APICURIO_DATASOURCE_USERNAME"], password_var, host, int(port), db)
    return logins


def test_airflow_and_the_registry_use_the_databases_postgres_init_creates():
    script = (DOCKER / "postgres-init.sh").read_text()
    password_env = dict(re.findall(r"\\getenv (\w+) (\w+)", script))  # psql variable -> env variable
    roles = dict(re.findall(r"CREATE ROLE (\w+) LOGIN PASSWORD :'(\w+)'", script))  # role -> psql variable
    owners = dict(re.findall(r"CREATE DATABASE (\w+) OWNER (\w+)", script))
    postgres_env = environment("postgres")
    assert environment("schema-registry")["APICURIO_STORAGE_SQL_KIND"] == "postgresql"
    for consumer, (user, var, host, port, db) in database_logins().items():
        assert host == "postgres" and port in listening_ports("postgres"), consumer
        assert owners.get(db) == user, f"{consumer}: postgres-init.sh creates no database {db} owned by {user}"
        # the login's password is the .env variable postgres-init sets that role's password from
        role_password = postgres_env[password_env[roles[user]]]
        assert REQUIRED_VAR.fullmatch(role_password).group(1) == var, f"{consumer}: {var} vs {role_password}"
    # one database per consumer, and none left over (the Iceberg catalog is iceberg-rest's SQLite file)
    assert set(owners) == {db for *_, db in database_logins().values()}


def test_the_catalog_is_the_rest_catalog_spark_and_pyiceberg_open_with_the_warehouse_settings():
    env = platform_env()
    uri = urlsplit(env["LAKEHOUSE_CATALOG_URI"])
    assert uri.scheme == "http" and uri.hostname == "iceberg-rest" and uri.port in listening_ports("iceberg-rest")
    platform = config.PlatformConfig(
        home=Path("/var/lib/lakehouse"), bootstrap_servers=env["LAKEHOUSE_BOOTSTRAP_SERVERS"],
        catalog_uri=env["LAKEHOUSE_CATALOG_URI"], warehouse=env["LAKEHOUSE_WAREHOUSE"], warehouse_explicit=True,
        object_store=config.ObjectStoreConfig(endpoint=env["LAKEHOUSE_S3_ENDPOINT"], path_style_access=True,
                                              region=env["LAKEHOUSE_S3_REGION"]))
    for name in {"lake"} | set(re.findall(r"catalog: (\w+)", "".join(
            p.read_text() for p in (REPO / "include" / "pipelines").rglob("*.y*ml")))):
        catalog = platform.catalog(name)
        assert catalog.type == "rest" and catalog.warehouse_on_s3, name
        spark = catalog.spark_properties()
        assert spark["type"] == "rest" and spark["uri"] == env["LAKEHOUSE_CATALOG_URI"]
        assert spark["s3.endpoint"] == env["LAKEHOUSE_S3_ENDPOINT"] and spark["s3.path-style-access"] == "true"
        assert catalog.pyiceberg_properties()["uri"] == env["LAKEHOUSE_CATALOG_URI"]


def test_the_registry_url_is_the_registrys_api_as_its_user():
    url = platform_env()["LAKEHOUSE_SCHEMA_REGISTRY_URL"]
    parts = urlsplit(VAR.sub("pw", url))
    assert parts.hostname == "schema-registry" and parts.port in listening_ports("schema-registry")
    assert parts.path == registry.CCOMPAT and parts.username == services.REGISTRY_USER
    platform = config.PlatformConfig(home=Path("/"), bootstrap_servers="kafka:19092",
                                     schema_registry_url=VAR.sub("pw", url))
    assert platform.schema_registry() == {"url": f"http://schema-registry:{parts.port}{registry.CCOMPAT}",
                                          "basic.auth.user.info": f"{services.REGISTRY_USER}:pw"}
    # the password is the one the registry's embedded user has, from the same .env variable
    user_password = environment("schema-registry")[quarkus_variable(
        f"quarkus.security.users.embedded.users.{services.REGISTRY_USER}")]
    assert REQUIRED_VAR.fullmatch(user_password).group(1) == REQUIRED_VAR.search(url).group(1)


def test_the_warehouse_is_on_the_object_store_with_the_key_it_accepts():
    env, store = platform_env(), environment("object-store")
    warehouse = urlsplit(env["LAKEHOUSE_WAREHOUSE"])
    assert warehouse.scheme in config.S3_SCHEMES
    command = words(SERVICES["object-store"]["command"])
    assert warehouse.hostname in [command[i + 1] for i, flag in enumerate(command[:-1]) if flag == "--bucket"]
    endpoint = urlsplit(env["LAKEHOUSE_S3_ENDPOINT"])
    assert endpoint.hostname == "object-store" and endpoint.port in listening_ports("object-store")
    assert env["LAKEHOUSE_S3_PATH_STYLE_ACCESS"] == "true"  # the server serves buckets by path
    # the driver side, the executors and the REST catalog's S3FileIO sign with the one key the store accepts
    for service in ("airflow-scheduler", "spark-worker", "iceberg-rest"):
        assert environment(service)["AWS_ACCESS_KEY_ID"] == store[object_store.ACCESS_KEY_VARIABLE], service
        assert environment(service)["AWS_SECRET_ACCESS_KEY"] == store[object_store.SECRET_KEY_VARIABLE], service
    rest = {rest_catalog.property_name(k): v for k, v in environment("iceberg-rest").items()
            if k.startswith("CATALOG_")}
    assert rest["s3.endpoint"] == env["LAKEHOUSE_S3_ENDPOINT"] and rest["client.region"] == env["LAKEHOUSE_S3_REGION"]
    assert rest["s3.path-style-access"] == env["LAKEHOUSE_S3_PATH_STYLE_ACCESS"]
    assert rest["warehouse"].startswith(env["LAKEHOUSE_WAREHOUSE"].rstrip("/") + "/")


def test_the_spark_master_url_is_the_master_the_worker_and_airflow_use():
    master = platform_env()["LAKEHOUSE_SPARK_MASTER"]
    host, port = urlsplit(master).hostname, urlsplit(master).port
    command = words(SERVICES[host]["command"])
    assert "org.apache.spark.deploy.master.Master" in command
    assert command[command.index("--host") + 1] == host and command[command.index("--port") + 1] == str(port)
    worker = words(SERVICES["spark-worker"]["command"])
    assert "org.apache.spark.deploy.worker.Worker" in worker and worker[-1] == master
    worker_host = worker[worker.index("--host") + 1]
    assert words(SERVICES["spark-worker"]["healthcheck"]["test"])[-1] == worker_host
    assert json.loads(platform_env()["AIRFLOW_CONN_SPARK_DEFAULT"]) == json.loads(airflow_spark.spark_connection(master))
    # Spark drivers run in the scheduler (LocalExecutor): executors reach it by this name
    assert environment("airflow-scheduler")["SPARK_LOCAL_HOSTNAME"] == SERVICES["airflow-scheduler"]["hostname"]


def test_airflow_runs_like_the_embedded_stack_on_postgres_with_authentication_on():
    from airflow.configuration import retrieve_configuration_description

    default_auth = retrieve_configuration_description()["core"]["options"]["auth_manager"]["default"]
    for name in ("airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
                 "airflow-triggerer"):
        env = environment(name)
        assert env["AIRFLOW__CORE__AUTH_MANAGER"] == default_auth  # the embedded stack's auth manager
        assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
        assert re.fullmatch(r"[^:,]+:admin", VAR.sub("admin", env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]))
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__CORE__PARALLELISM"] == str(airflow_stack.PARALLELISM)
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == f"{APP_ROOT}/{airflow_stack.DAGS_FOLDER.relative_to(REPO)}"
        assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == f"{APP_ROOT}/{airflow_stack.PLUGINS_FOLDER.relative_to(REPO)}"
    # the admin's password reaches airflow-init only, which writes the file the api-server reads
    holders = [name for name in SERVICES if "AIRFLOW_ADMIN_PASSWORD" in environment(name)]
    assert holders == ["airflow-init"]
    password_dir = str(Path(environment("airflow-api-server")["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).parent)
    volumes = {name: [v for v in SERVICES[name]["volumes"] if v.split(":")[1] == password_dir]
               for name in ("airflow-init", "airflow-api-server")}
    assert volumes["airflow-init"] == volumes["airflow-api-server"] != []
    assert volumes["airflow-init"][0].split(":")[0] in COMPOSE["volumes"]


def test_paths_the_stack_mounts_or_runs_exist_in_the_repository():
    for name, spec in SERVICES.items():
        for volume in spec.get("volumes") or []:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in COMPOSE["volumes"], f"{name}: undeclared volume {source}"
        for word in service_text(name).split():
            if word.startswith(APP_ROOT + "/"):
                assert (REPO / word[len(APP_ROOT) + 1:]).exists(), f"{name} uses missing {word}"


def test_the_pipelines_dir_is_mounted_from_the_repository_specs():
    specs = config.REPO_ROOT / "include" / "pipelines"
    for name in SERVICES:
        target = environment(name).get("LAKEHOUSE_PIPELINES_DIR")
        if target:
            assert f"./{specs.relative_to(REPO)}:{target}:ro" in SERVICES[name]["volumes"], name


# ---------------------------------------------------------------------------- docker/postgres-init.sh

@pytest.fixture
def throwaway_postgres():
    """(socket folder, port) of a new PostgreSQL cluster with password authentication over TCP,
    stopped and deleted after the test. `make setup` installs the server binaries it needs."""
    with postgres_cluster(auth_host="scram-sha-256") as server:
        yield server.socket_dir, server.port


def test_postgres_init_creates_the_databases_airflow_and_the_registry_log_into(throwaway_postgres):
    import psycopg2

    socket_dir, port = throwaway_postgres
    passwords = {"AIRFLOW_DB_PASSWORD": "airflow-pw-1", "REGISTRY_DB_PASSWORD": "registry-pw-2"}
    done = subprocess.run(["bash", str(DOCKER / "postgres-init.sh")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **passwords, "POSTGRES_USER": "postgres", "PGHOST": str(socket_dir),
                               "PGPORT": str(port)})
    assert done.returncode == 0, done.stderr
    # each login exactly as the compose file gives it, aimed at this cluster: it logs in with the password
    # of its .env variable and may create tables in its database (Airflow's migrations, Apicurio's schema)
    for user, var, _host, _port, db in database_logins().values():
        conn = psycopg2.connect(host="127.0.0.1", port=port, user=user, password=passwords[var], dbname=db)
        with conn, conn.cursor() as cursor:
            cursor.execute("CREATE TABLE owned_here (id int)")
        conn.close()
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(host="127.0.0.1", port=port, user="registry", password="wrong", dbname="registry")


# ---------------------------------------------------------------------------- docker/airflow_init.py

@pytest.fixture
def airflow_init(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """docker/airflow_init.py as a module, with the compose stack's auth settings on tmp_path."""
    spec = importlib.util.spec_from_file_location("lakehouse_docker_airflow_init", DOCKER / "airflow_init.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "ops:admin")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp_path / "auth" / "passwords.json"))
    monkeypatch.setenv("AIRFLOW_ADMIN_PASSWORD", "from-dot-env")
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", f"sqlite:///{tmp_path / 'catalog.db'}")
    monkeypatch.setenv("LAKEHOUSE_WAREHOUSE", (tmp_path / "warehouse").as_uri())
    return module


def test_airflow_init_writes_the_password_file_the_auth_manager_reads(airflow_init, tmp_path: Path):
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    (tmp_path / "auth").mkdir()
    (tmp_path / "auth" / "passwords.json").write_text('{"ops": "old"}\n')  # a password changed in .env
    path = airflow_init.write_password_file()
    assert SimpleAuthManager.get_passwords() == {"ops": "from-dot-env"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["passwords.json"]


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("AIRFLOW_ADMIN_PASSWORD", "", "AIRFLOW_ADMIN_PASSWORD is empty"),
    ("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "ops:admin,viewer:viewer", "exactly one user"),
])
def test_airflow_init_refuses_an_unusable_setting(airflow_init, monkeypatch, setting, value, message):
    monkeypatch.setenv(setting, value)
    with pytest.raises(airflow_init.InitError, match=message):
        airflow_init.write_password_file()


def test_airflow_init_creates_the_catalog_tables_without_printing_the_password(airflow_init, tmp_path, capsys):
    assert airflow_init.main() == 0
    with sqlite3.connect(tmp_path / "catalog.db") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "iceberg_tables" in tables
    out = capsys.readouterr()
    assert "from-dot-env" not in out.out + out.err and "ops" in out.out


class RestConfigHandler(http.server.BaseHTTPRequestHandler):
    """A REST catalog that answers GET /v1/config only, recording every request it gets."""

    requests: ClassVar[list[tuple[str, str]]] = []

    def do_GET(self) -> None:
        self.requests.append(("GET", self.path))
        body = json.dumps({"defaults": {}, "overrides": {}}).encode()
        status = 200 if urlsplit(self.path).path == "/v1/config" else 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.requests.append(("POST", self.path))
        self.send_response(500)
        self.end_headers()

    do_PUT = do_DELETE = do_HEAD = do_POST

    def log_message(self, *args) -> None:
        pass


def test_airflow_init_asks_a_rest_catalog_for_its_configuration_and_creates_nothing(airflow_init, monkeypatch,
                                                                                    capsys):
    handler = type("Handler", (RestConfigHandler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", f"http://127.0.0.1:{server.server_address[1]}")
        assert airflow_init.main() == 0
    finally:
        server.shutdown()
        server.server_close()
    assert [(method, urlsplit(path).path) for method, path in handler.requests] == [("GET", "/v1/config")]
    assert "Iceberg catalog ready (rest" in capsys.readouterr().out


# ---------------------------------------------------------------------------- docker/healthcheck.py

@pytest.fixture
def healthcheck():
    spec = importlib.util.spec_from_file_location("lakehouse_docker_healthcheck", DOCKER / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def http_root(tmp_path: Path):
    """(folder, base URL): a local HTTP server serving the folder, stopped after the test."""
    root = tmp_path / "http"
    root.mkdir()
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_healthcheck_http_wants_a_2xx_answer(healthcheck, http_root):
    root, url = http_root
    (root / "health").write_text("ok")
    assert healthcheck.main(["http", f"{url}/health"]) == 0
    assert healthcheck.main(["http", f"{url}/absent"]) == 1
    assert healthcheck.main(["http"]) == 2


def test_healthcheck_spark_worker_wants_the_worker_alive_at_the_master(healthcheck, http_root):
    root, url = http_root
    (root / "json").mkdir()
    master = {"status": "ALIVE", "workers": [{"host": "spark-worker", "state": "DEAD"},
                                             {"host": "other", "state": "ALIVE"}]}
    (root / "json" / "index.html").write_text(json.dumps(master))
    assert healthcheck.spark_worker_registered(f"{url}/json/", "spark-worker") == \
        "the master lists no ALIVE worker on spark-worker; workers: spark-worker (DEAD), other (ALIVE)"
    master["workers"].append({"host": "spark-worker", "state": "ALIVE"})
    (root / "json" / "index.html").write_text(json.dumps(master))
    assert healthcheck.main(["spark-worker", f"{url}/json/", "spark-worker"]) == 0


# ---------------------------------------------------------------------------- lakehouse_dev.object_store serve

def test_object_store_accepts_the_key_pair_of_the_environment_in_place_of_its_own(tmp_path: Path):
    folder = tmp_path / "object-store"
    generated = object_store.ensure_credentials(folder)
    given = {object_store.ACCESS_KEY_VARIABLE: "lakehouse-key", object_store.SECRET_KEY_VARIABLE: "s3cr3t-from-env"}
    assert object_store.install_credentials(folder, given) == object_store.Credentials("lakehouse-key",
                                                                                      "s3cr3t-from-env")
    # written where the server and the stack read it, owner-only, replacing the generated pair
    assert object_store.ensure_credentials(folder) != generated
    assert object_store.ensure_credentials(folder).secret_access_key == "s3cr3t-from-env"
    assert stat.S_IMODE((folder / "credentials.json").stat().st_mode) == 0o600
    # without the variables the pair on disk stays
    assert object_store.install_credentials(folder, {}).access_key_id == "lakehouse-key"
    assert "s3cr3t" not in repr(object_store.install_credentials(folder, given))


@pytest.mark.parametrize(("given", "message"), [
    ({object_store.SECRET_KEY_VARIABLE: "s3cr3t-half"}, f"{object_store.ACCESS_KEY_VARIABLE} is not"),
    ({object_store.ACCESS_KEY_VARIABLE: "key"}, f"{object_store.SECRET_KEY_VARIABLE} is not"),
    ({object_store.ACCESS_KEY_VARIABLE: "a/b", object_store.SECRET_KEY_VARIABLE: "s3cr3t-half"}, "neither '/'"),
])
def test_object_store_refuses_an_unusable_key_pair_without_printing_the_secret(tmp_path, monkeypatch, capsys,
                                                                               given, message):
    for name in object_store.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    data = tmp_path / "data"
    assert object_store.main(["serve", "--port", "0", "--data", str(data)]) == 1
    err = capsys.readouterr().err
    assert message in err and "s3cr3t" not in err
    assert not data.exists()  # refused before taking the folder


def test_object_store_serve_takes_the_options_the_compose_file_gives(monkeypatch):
    calls = []
    monkeypatch.setattr(object_store, "serve", lambda *args: calls.append(args))
    command = words(SERVICES["object-store"]["command"])
    assert object_store.main(command[3:]) == 0
    assert object_store.main(["serve", "--data", "/d"]) == 0
    assert calls == [(9000, Path("/var/lib/object-store"), "0.0.0.0", ["lakehouse"]),
                     (object_store.DEFAULT_PORT, Path("/d"), "127.0.0.1", [])]
    assert object_store.main(["serve", "--data", "/d", "--bucket", "a", "--bucket", "b"]) == 0
    assert calls[-1][3] == ["a", "b"]


def test_object_store_creates_the_buckets_it_is_given_once_and_keeps_them(tmp_path: Path):
    from moto.s3.models import s3_backends

    backend = s3_backends["000000000041"]["aws"]  # a moto account of its own (bucket names are global)
    names = ["compose-test-bucket-a", "compose-test-bucket-b"]
    try:
        mirror = object_store.DiskMirror(tmp_path, backend)
        assert mirror.load() == (0, 0)
        assert object_store.ensure_buckets(mirror, names) == names
        assert object_store.ensure_buckets(mirror, names[:1]) == []
        assert (tmp_path / "buckets" / names[0]).is_dir()
        for name in names:  # the process ends; a restart loads them back
            backend.delete_bucket(name)
        assert object_store.DiskMirror(tmp_path, backend).load() == (2, 0)
    finally:
        for name in set(names) & set(backend.buckets):
            backend.delete_bucket(name)
    with pytest.raises(object_store.ObjectStoreError, match="not an S3 bucket name"):
        object_store.serve(0, tmp_path / "refused", buckets=["Not_A_Bucket"])


# ---------------------------------------------------------------------------- compose and stack agree
#
# The development stack's servers are the reference: what they run and how they are configured is read
# from its modules and POMs, not written again here, so a change on either side that the other lacks fails.

def pom_property(part: str, name: str) -> str:
    """A <properties> value of devstack/jvm/<part>/pom.xml."""
    found = ElementTree.parse(REPO / "devstack" / "jvm" / part / "pom.xml").getroot().find(
        f"{{http://maven.apache.org/POM/4.0.0}}properties/{{http://maven.apache.org/POM/4.0.0}}{name}")
    assert found is not None and found.text, f"devstack/jvm/{part}/pom.xml has no {name}"
    return found.text.strip()


def properties_text(text: str) -> dict[str, str]:
    """key=value lines of a Java properties file (as the stack's modules write them)."""
    pairs = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.replace("\\\\", "\\")
    return pairs


def kafka_setting(variable: str) -> str:
    """The server property the apache/kafka image makes of variable KAFKA_<NAME> (KafkaDockerWrapper:
    prefix dropped, lower-cased, `_` -> `.`, then `...` -> `-` and `..` -> `_`)."""
    return variable.replace("KAFKA_", "").lower().replace("_", ".").replace("...", "-").replace("..", "_")


def quarkus_variable(prop: str) -> str:
    """The environment variable Quarkus (SmallRye Config) reads as property `prop`: every character other
    than a letter or a digit becomes `_`, upper-cased."""
    return re.sub(r"[^A-Za-z0-9]", "_", prop).upper()


@pytest.fixture
def stack_servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict:
    """What lakehouse_dev.services starts for `stack up --object-store --catalog rest`, without starting it:
    {"object_store": (entry, command), "rest_catalog": (entry, command, environment)}, the processes'
    spawning and readiness replaced, in a stack home under tmp_path."""
    spawned = []

    def spawn(cmd, log_path, env=None):
        spawned.append((cmd, env))
        return types.SimpleNamespace(pid=2 ** 22 + len(spawned), poll=lambda: None, returncode=None)

    monkeypatch.setattr(processes, "spawn", spawn)
    monkeypatch.setattr(object_store, "wait_ready", lambda *a, **k: {"ok": True})
    monkeypatch.setattr(object_store, "create_bucket", lambda *a, **k: True)
    monkeypatch.setattr(rest_catalog, "wait_ready", lambda *a, **k: None)
    monkeypatch.setattr(rest_catalog, "java_command", lambda layout, s3=False: ["java", f"s3={s3}"])
    home = tmp_path / "stack"
    store = services.start_object_store(home, object_store.DEFAULT_PORT)
    catalog = services.start_rest_catalog(home, services.DEFAULT_PORTS["rest_catalog"], store)
    (store_cmd, _), (catalog_cmd, catalog_env) = spawned
    return {"home": home, "object_store": (store, store_cmd), "rest_catalog": (catalog, catalog_cmd, catalog_env)}


def test_images_are_the_versions_the_stack_runs():
    assert image_tag("apache/kafka") == pom_property("kafka", "kafka.version")
    assert image_tag("apache/iceberg-rest-fixture") == pom_property("iceberg-rest", "iceberg.version") \
        == config.ICEBERG_VERSION
    assert image_tag("apicurio/apicurio-registry") == pom_property("registry", "apicurio.version")
    # the project image's Python packages are the lock: test_the_project_image_builds_from_...


def test_postgres_is_the_major_version_the_tests_run():
    """The stack runs no PostgreSQL of its own: the tests run docker/postgres-init.sh, Airflow's and the
    registry's logins on the server `make setup` installs (Debian's `postgresql`, the newest major under
    /usr/lib/postgresql, as tests/support/pgserver.py picks it). Compose runs that major version (the minor follows
    the distribution's updates)."""
    try:
        installed = postgres_bin_dir().parent.name
    except PostgresMissing as exc:  # `make setup` installs it: its absence is a set-up defect, not a reason to skip
        pytest.fail(f"no PostgreSQL server installed to compare with ({exc}): run `make setup`")
    assert image_tag("postgres").split(".")[0] == installed


# Settings of kafka_broker.server_properties that compose sets otherwise, and why.
KAFKA_DIFFERENT = {
    # addresses and listeners: the stack's on 127.0.0.1 (one per security protocol), compose's for the host
    # (HOST) and the containers (DOCKER), both PLAINTEXT, on the compose network
    "listeners", "advertised.listeners", "listener.security.protocol.map", "inter.broker.listener.name",
    "controller.quorum.voters",
    "log.dirs",  # a path: the stack's home, the compose volume
    # the stack's security set-up (its CA's TLS key, SCRAM logins, ACLs): compose's listeners are PLAINTEXT
    # inside the compose network and loopback on the host
    "ssl.keystore.type", "ssl.keystore.location", "ssl.client.auth", "sasl.enabled.mechanisms",
    "authorizer.class.name", "super.users", "allow.everyone.if.no.acl.found",
}
KAFKA_DIFFERENT_PREFIXES = ("listener.name.",)  # the SASL listeners' JAAS configurations


def test_kafka_runs_with_the_stacks_broker_settings(tmp_path: Path):
    ports = {name: 19092 + i for i, name in enumerate((*kafka_broker.CLIENT_PROTOCOLS, "CONTROLLER"))}
    stack = properties_text(kafka_broker.server_properties(kafka_broker.Layout(tmp_path), ports, tmp_path / "k.pem"))
    compose = {kafka_setting(key): value for key, value in environment("kafka").items() if key.startswith("KAFKA_")}
    assert KAFKA_DIFFERENT <= set(stack), f"differences the stack no longer has: {KAFKA_DIFFERENT - set(stack)}"
    different = {key for key in stack if key in KAFKA_DIFFERENT or key.startswith(KAFKA_DIFFERENT_PREFIXES)}
    for key, value in stack.items():
        if key not in different:
            assert compose.get(key) == value, \
                f"broker setting {key}: the stack's {value!r}, compose's {compose.get(key)!r}"
    # and nothing the stack does not set
    assert set(compose) <= set(stack), f"compose only: {set(compose) - set(stack)}"
    assert not {k for k in compose if k.startswith(("ssl.", "sasl.", "listener.name."))}


# Catalog properties of the stack's REST catalog (rest_catalog.environment, as services.start_rest_catalog
# builds it over the object store) that compose sets otherwise, and why.
REST_DIFFERENT = {
    "uri": "the JdbcCatalog's SQLite file: in the image's home folder (a volume), not the stack's home",
    "s3.endpoint": "the object store's address: its service name on the compose network, not 127.0.0.1",
    "rest.port": "the port: the image's 8181, not the stack's 18181 (or the next free one)",
    "jdbc.init-catalog-tables": "false once the database has the catalog's tables (rest_catalog.environment): "
                                "the image's fixed environment leaves Iceberg's default, true",
}


def test_the_rest_catalog_runs_with_the_stacks_settings(stack_servers):
    store, _ = stack_servers["object_store"]
    catalog, command, stack_env = stack_servers["rest_catalog"]
    stack = {rest_catalog.property_name(k): v for k, v in stack_env.items() if k.startswith("CATALOG_")}
    compose_env = environment("iceberg-rest")
    compose = {rest_catalog.property_name(k): v for k, v in compose_env.items() if k.startswith("CATALOG_")}
    assert set(compose) == set(stack)
    assert set(REST_DIFFERENT) <= set(stack)
    for key, value in stack.items():
        if key not in REST_DIFFERENT:
            assert compose[key] == value, f"catalog property {key}: the stack's {value!r}, compose's {compose[key]!r}"
    # the differences, each the compose counterpart of the stack's value
    layout = rest_catalog.Layout(stack_servers["home"])
    volume_target = next(v.split(":")[1] for v in SERVICES["iceberg-rest"]["volumes"])
    assert compose["uri"] == stack["uri"].replace(str(layout.database), f"{volume_target}/{layout.database.name}")
    assert compose["s3.endpoint"] == platform_env()["LAKEHOUSE_S3_ENDPOINT"]
    assert stack["s3.endpoint"] == store["endpoint"]
    assert int(compose["rest.port"]) == urlsplit(platform_env()["LAKEHOUSE_CATALOG_URI"]).port
    # the same warehouse, as the platform's is the stack's object-store warehouse
    assert platform_env()["LAKEHOUSE_WAREHOUSE"] == store["warehouse"] and compose["warehouse"] == catalog["warehouse"]
    # S3FileIO's key as the AWS SDK's variables, and its checksums as the stack's JVM options ask
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(stack_env) & set(compose_env)
    assert "s3=True" in command
    for option in rest_catalog.S3_CHECKSUM_OPTIONS:
        name, value = option.removeprefix("-D").split("=")
        variable = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name.replace(".", "_")).upper()  # AWS_REQUEST_CHECKSUM_...
        assert compose_env.get(variable) == value, f"{option}: {variable}={compose_env.get(variable)!r}"


def test_the_rest_catalog_creates_its_tables_only_in_a_database_without_them(tmp_path: Path):
    """A restarted server must not run Iceberg's table check, which leaves a SQLite lock behind (see
    rest_catalog.environment; the restart itself: tests/e2e/test_rest_catalog.py)."""
    layout = rest_catalog.Layout(tmp_path)
    variable = rest_catalog.env_name("jdbc.init-catalog-tables")

    def initializes() -> str:
        return rest_catalog.environment(layout, 18181, "file:///warehouse", base={})[variable]

    assert initializes() == "true"  # the first start
    layout.folder.mkdir(parents=True)
    sqlite3.connect(layout.database).close()
    assert initializes() == "true"  # a first start that died before creating the tables
    with contextlib.closing(sqlite3.connect(layout.database)) as db, db:
        db.execute(f"CREATE TABLE {rest_catalog.JDBC_TABLES[0]} (catalog_name VARCHAR(255))")
    assert initializes() == "true"  # one table of two
    with contextlib.closing(sqlite3.connect(layout.database)) as db, db:
        db.execute(f"CREATE TABLE {rest_catalog.JDBC_TABLES[1]} (catalog_name VARCHAR(255))")
    assert initializes() == "false"
    layout.database.write_bytes(b"not a database" * 100)
    assert initializes() == "true"  # unreadable: the server says what is wrong with it


# Properties of the stack's registry (registry.application_properties) that compose sets otherwise, and why.
REGISTRY_DIFFERENT = {
    # storage: PostgreSQL (the compose file's database server) instead of H2 (a file in the stack's home)
    "apicurio.storage.sql.kind", "apicurio.datasource.url",
    # the user's password comes from .env as it is: compose keeps it as plain text (the stack writes its
    # digest, and the digest's algorithm, into a properties file of its own)
    "quarkus.security.users.embedded.plain-text", "quarkus.security.users.embedded.algorithm",
    f"quarkus.security.users.embedded.users.{services.REGISTRY_USER}",
}
# Compose's settings the stack has no counterpart of: the PostgreSQL login (H2 needs none).
REGISTRY_COMPOSE_ONLY = {"APICURIO_DATASOURCE_USERNAME", "APICURIO_DATASOURCE_PASSWORD"}


def test_the_registry_runs_with_the_stacks_settings(tmp_path: Path):
    stack = properties_text(registry.application_properties(registry.Layout(tmp_path), {services.REGISTRY_USER: "pw"}))
    compose = environment("schema-registry")
    assert REGISTRY_DIFFERENT <= set(stack)
    for key, value in stack.items():
        variable = quarkus_variable(key)
        if key == "quarkus.security.users.embedded.algorithm":
            assert variable not in compose  # of digests only
        elif key not in REGISTRY_DIFFERENT:
            assert compose.get(variable) == value, \
                f"{key} ({variable}): the stack's {value!r}, compose's {compose.get(variable)!r}"
    assert set(compose) <= {quarkus_variable(key) for key in stack} | REGISTRY_COMPOSE_ONLY, "compose only"
    # the differences
    assert stack["apicurio.storage.sql.kind"] == "h2" and compose["APICURIO_STORAGE_SQL_KIND"] == "postgresql"
    assert compose["APICURIO_DATASOURCE_URL"].startswith("jdbc:postgresql://")
    assert stack["quarkus.security.users.embedded.plain-text"] == "false"
    assert compose["QUARKUS_SECURITY_USERS_EMBEDDED_PLAIN_TEXT"] == "true"
    user = quarkus_variable(f"quarkus.security.users.embedded.users.{services.REGISTRY_USER}")
    assert REQUIRED_VAR.fullmatch(compose[user])  # the password from .env, never written here


def test_the_object_store_is_the_stacks_server(stack_servers):
    store, stack_command = stack_servers["object_store"]
    compose_command = words(SERVICES["object-store"]["command"])
    assert stack_command[1:4] == compose_command[1:4] == ["-m", object_store.MODULE, "serve"]

    def options(args: list[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for flag, value in zip(args[4::2], args[5::2]):
            found.setdefault(flag, []).append(value)
        return found

    stack, compose = options(stack_command), options(compose_command)
    assert set(stack) <= set(compose) and set(compose) - set(stack) <= {"--host", "--bucket"}
    # compose listens on the container's interfaces (the stack keeps the default, loopback) and has the server
    # create the bucket the stack creates with create_bucket once the server answers
    assert "--host" not in stack and compose["--host"] == ["0.0.0.0"]
    assert compose["--bucket"] == [store["bucket"]] == [object_store.DEFAULT_BUCKET]
    assert compose["--data"] == [v.split(":")[1] for v in SERVICES["object-store"]["volumes"]]
    assert set(environment("object-store")) == set(object_store.ENVIRONMENT)
    # its clients get the settings the stack gives its own (lakehouse_dev.settings), the address aside
    settings = services.object_store_settings(stack_servers["home"], store)
    env = platform_env()
    assert env["LAKEHOUSE_WAREHOUSE"] == store["warehouse"]
    assert env["LAKEHOUSE_S3_REGION"] == settings["region"] == object_store.REGION
    assert config.parse_bool(env["LAKEHOUSE_S3_PATH_STYLE_ACCESS"], "path style") is settings["path_style_access"]
    stack_clients = object_store.client_environment(store["endpoint"], object_store.Credentials("k", "s"))
    for key in stack_clients:
        if key.startswith("LAKEHOUSE_"):
            assert key in env, key
