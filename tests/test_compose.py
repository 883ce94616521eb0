"""docker-compose.yaml and docker/, checked without Docker (none runs on the project's machines).

The file is read as data: which services exist, that images are pinned, that every
long-running service has a healthcheck and every service waits for the ones it talks to,
that ports are published on loopback only, that no secret is written in it and every
variable it interpolates is in .env.example, that every setting it gives is one something
reads (config.py, Airflow, Spark, the AWS SDKs, the docker/ scripts), and that the addresses
in the settings name the services and ports declared. The scripts of docker/ run here
against local stand-ins: a Maven repository over HTTP, a fake `mc`, a throwaway PostgreSQL
cluster, a fake Spark master.
"""

from __future__ import annotations

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
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from pgserver import cluster as postgres_cluster

from lakehouse.core import config
from lakehouse_airflow import spark as airflow_spark
from lakehouse_dev import airflow_stack

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
PINNED_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/-]*:(?!latest$)"
                          r"(?:v?\d+\.\d+(?:\.\d+)?(?:-[\w.]+)?|RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ)")
EXPECTED_SERVICES = {"kafka", "postgres", "minio", "minio-init", "spark-master", "spark-worker", "airflow-init",
                     "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}
# Variables of third-party images, by image name: what their documentation says they read.
IMAGE_VARIABLES = {"apache/kafka": ("KAFKA_", "CLUSTER_ID"), "postgres": ("POSTGRES_",),
                   "minio/minio": ("MINIO_ROOT_",), "minio/mc": ()}
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


# ---------------------------------------------------------------------------- services and images

def test_the_stack_is_kafka_postgres_minio_spark_and_airflow():
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
    assert "pip install --no-cache-dir -r requirements.txt -c requirements.lock" in runs
    # editable, as scripts/setup.sh installs it: lakehouse.core.config.REPO_ROOT is then APP_ROOT
    assert "pip install --no-cache-dir --no-deps -e ." in runs
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
            for password in re.findall(r"://[^/:@\s]+:([^@\s]+)@", value):
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
    settings = [key for name in SERVICES for key in environment(name)] + list(dockerfile_pairs("ENV"))
    for key in settings:
        if key.startswith("LAKEHOUSE_"):
            assert key in PLATFORM_SETTINGS or key.startswith(config.KAFKA_PREFIX), key


def test_settings_kept_out_of_airflow_templated_fields_reach_spark_submit_from_the_task_runner():
    """submit_kwargs forwards only the allow-list into env_vars (rendered and stored by Airflow), from
    the DAG processor's environment; what it withholds, the catalog URI with its password first of all,
    must be in the environment of the container that runs the tasks, which spark-submit inherits."""
    parsing, running = environment("airflow-dag-processor"), environment("airflow-scheduler")
    assert running["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"  # tasks run in the scheduler container
    withheld = {key for key, value in parsing.items()
                if key.startswith("LAKEHOUSE_") and not airflow_spark.forwardable(key, VAR.sub("pw", value))}
    assert "LAKEHOUSE_CATALOG_URI" in withheld
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
                assert key in PLATFORM_SETTINGS, key
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


def database_urls() -> dict[str, tuple[str, str, str, str, int, str]]:
    """{setting: (scheme, user, password variable, host, port, database)} of both database URLs."""
    pattern = re.compile(r"([\w+]+)://(\w+):\$\{(\w+):\?[^}]*\}@([\w-]+):(\d+)/(\w+)")
    urls = {}
    for key in ("LAKEHOUSE_CATALOG_URI", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        scheme, user, var, host, port, db = pattern.fullmatch(platform_env()[key]).groups()
        urls[key] = (scheme, user, var, host, int(port), db)
    return urls


def test_the_catalog_and_airflow_databases_are_the_ones_postgres_init_creates():
    script = (DOCKER / "postgres-init.sh").read_text()
    password_env = dict(re.findall(r"\\getenv (\w+) (\w+)", script))  # psql variable -> env variable
    roles = dict(re.findall(r"CREATE ROLE (\w+) LOGIN PASSWORD :'(\w+)'", script))  # role -> psql variable
    owners = dict(re.findall(r"CREATE DATABASE (\w+) OWNER (\w+)", script))
    postgres_env = environment("postgres")
    for key, (scheme, user, var, host, port, db) in database_urls().items():
        assert scheme == "postgresql+psycopg2", key
        assert host == "postgres" and port in listening_ports("postgres"), key
        assert owners.get(db) == user, f"{key}: postgres-init.sh creates no database {db} owned by {user}"
        # the URL's password is the .env variable postgres-init sets that role's password from
        role_password = postgres_env[password_env[roles[user]]]
        assert REQUIRED_VAR.fullmatch(role_password).group(1) == var, f"{key}: {var} vs {role_password}"
    # the catalog URL is one config turns into a JDBC URL for Spark
    catalog = config.CatalogConfig("lake", "jdbc", VAR.sub("pw", platform_env()["LAKEHOUSE_CATALOG_URI"]), "s3://b/w")
    assert catalog.jdbc() == ("jdbc:postgresql://postgres:5432/iceberg", {"user": "iceberg", "password": "pw"})


def test_the_warehouse_and_its_credentials_are_the_ones_minio_init_prepares():
    env, init = platform_env(), environment("minio-init")
    assert urlsplit(env["LAKEHOUSE_WAREHOUSE"]).scheme in config.S3_SCHEMES
    assert init["LAKEHOUSE_WAREHOUSE"] == env["LAKEHOUSE_WAREHOUSE"]
    assert init["LAKEHOUSE_S3_ENDPOINT"] == env["LAKEHOUSE_S3_ENDPOINT"]
    endpoint = urlsplit(env["LAKEHOUSE_S3_ENDPOINT"])
    assert endpoint.hostname == "minio" and endpoint.port in listening_ports("minio")
    assert env["LAKEHOUSE_S3_PATH_STYLE_ACCESS"] == "true"  # MinIO serves buckets by path
    for service in ("airflow-scheduler", "spark-worker"):  # the driver side and the executors
        assert environment(service)["AWS_ACCESS_KEY_ID"] == init["MINIO_LAKEHOUSE_USER"]
        assert environment(service)["AWS_SECRET_ACCESS_KEY"] == init["MINIO_LAKEHOUSE_PASSWORD"]


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


# ---------------------------------------------------------------------------- docker/minio-init.sh

FAKE_MC = """#!/bin/sh
# records each call; `admin policy attach` answers as FAKE_MC_ATTACH says
echo "$*" >> "$MC_LOG"
case "$*" in
  "admin policy create "*) cp "$6" "$MC_LOG.policy" ;;
  "admin policy attach "*)
    case "$FAKE_MC_ATTACH" in
      already) echo "mc: <ERROR> The specified policy change is already in effect." >&2; exit 1 ;;
      fail) echo "mc: <ERROR> Unable to connect" >&2; exit 1 ;;
    esac ;;
esac
"""


def run_minio_init(tmp_path: Path, warehouse: str = "s3://lakehouse/warehouse", attach: str = "ok"):
    """docker/minio-init.sh with a fake `mc` on PATH: (result, mc calls, policy JSON or None)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    mc = bin_dir / "mc"
    mc.write_text(FAKE_MC)
    mc.chmod(mc.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "mc.log"
    log.unlink(missing_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MC_LOG": str(log), "FAKE_MC_ATTACH": attach, "TMPDIR": str(tmp_path),
           "MINIO_ROOT_USER": "root", "MINIO_ROOT_PASSWORD": "root-password", "MINIO_LAKEHOUSE_USER": "lakehouse",
           "MINIO_LAKEHOUSE_PASSWORD": "lakehouse-password", "LAKEHOUSE_WAREHOUSE": warehouse,
           "LAKEHOUSE_S3_ENDPOINT": "http://minio:9000"}
    done = subprocess.run(["/bin/sh", str(DOCKER / "minio-init.sh")], env=env, capture_output=True, text=True,
                          timeout=30)
    calls = log.read_text().splitlines() if log.exists() else []
    policy = Path(f"{log}.policy")
    return done, calls, json.loads(policy.read_text()) if policy.exists() else None


def test_minio_init_creates_the_warehouse_bucket_and_a_user_limited_to_it(tmp_path: Path):
    done, calls, policy = run_minio_init(tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls[0] == "alias set lakehouse http://minio:9000 root root-password"
    assert "mb --ignore-existing lakehouse/lakehouse" in calls
    assert "admin user add lakehouse lakehouse lakehouse-password" in calls
    assert "admin policy attach lakehouse lakehouse-warehouse --user lakehouse" in calls
    resources = {r for statement in policy["Statement"] for r in statement["Resource"]}
    assert resources == {"arn:aws:s3:::lakehouse", "arn:aws:s3:::lakehouse/*"}


def test_minio_init_reruns_when_the_policy_is_already_attached_but_fails_on_other_errors(tmp_path: Path):
    assert run_minio_init(tmp_path, attach="already")[0].returncode == 0
    failed = run_minio_init(tmp_path, attach="fail")[0]
    assert failed.returncode == 1 and "Unable to connect" in failed.stderr


def test_minio_init_takes_the_bucket_from_an_s3a_warehouse_and_refuses_a_non_s3_one(tmp_path: Path):
    assert "mb --ignore-existing lakehouse/other-bucket" in run_minio_init(tmp_path, "s3a://other-bucket/wh/x")[1]
    refused, calls, _ = run_minio_init(tmp_path, "file:///tmp/warehouse")
    assert refused.returncode == 2 and "not an s3:// location" in refused.stderr and calls == []


# ---------------------------------------------------------------------------- docker/postgres-init.sh

@pytest.fixture
def throwaway_postgres():
    """(socket folder, port) of a new PostgreSQL cluster with password authentication over TCP,
    stopped and deleted after the test. `make setup` installs the server binaries it needs."""
    with postgres_cluster(auth_host="scram-sha-256") as server:
        yield server.socket_dir, server.port


def test_postgres_init_creates_databases_the_catalog_and_airflow_log_into(throwaway_postgres, tmp_path: Path):
    import psycopg2
    import sqlalchemy
    from pyiceberg.catalog.sql import SqlCatalog

    socket_dir, port = throwaway_postgres
    passwords = {"ICEBERG_DB_PASSWORD": "iceberg-pw-1", "AIRFLOW_DB_PASSWORD": "airflow-pw-2"}
    done = subprocess.run(["bash", str(DOCKER / "postgres-init.sh")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **passwords, "POSTGRES_USER": "postgres", "PGHOST": str(socket_dir),
                               "PGPORT": str(port)})
    assert done.returncode == 0, done.stderr
    # the URLs exactly as the compose file writes them, aimed at this cluster: each logs in
    # and may create tables in its database
    for key in database_urls():
        url = VAR.sub(lambda m: passwords[m.group(1)], platform_env()[key]).replace(
            "@postgres:5432/", f"@127.0.0.1:{port}/")
        engine = sqlalchemy.create_engine(url)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("CREATE TABLE owned_here (id int)"))
        engine.dispose()
        if key == "LAKEHOUSE_CATALOG_URI":  # pyiceberg creates the catalog tables as the iceberg role
            catalog = SqlCatalog("lake", uri=url, warehouse=(tmp_path / "wh").as_uri())
            catalog.create_namespace("raw")
            assert ("raw",) in catalog.list_namespaces()
            catalog.engine.dispose()
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(host="127.0.0.1", port=port, user="iceberg", password="wrong", dbname="iceberg")


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
