"""Where things are: the platform's environment, read once from variables.

Every component (CLI, Spark job, tests, later the DAGs) asks this module for the
Kafka bootstrap servers, the Iceberg catalog and the warehouse, so pointing the
platform at a real cluster is a matter of environment variables only:

    LAKEHOUSE_HOME               state folder of the embedded stack (default: <repo>/.lakehouse)
    LAKEHOUSE_PIPELINES_DIR      folder of pipeline YAML specs (default: <repo>/include/pipelines)
    LAKEHOUSE_BOOTSTRAP_SERVERS  Kafka bootstrap servers (default: the embedded broker)
    LAKEHOUSE_BROKER_PORT        port of the embedded broker (default: 19092)
    LAKEHOUSE_KAFKA_<PROP>       extra librdkafka properties, e.g. LAKEHOUSE_KAFKA_SECURITY_PROTOCOL
    LAKEHOUSE_CATALOG_URI        SQLAlchemy URI of the Iceberg JDBC catalog database
                                 (default: sqlite:///<home>/catalog.db)
    LAKEHOUSE_WAREHOUSE          warehouse location (default: file://<home>/warehouse)
    LAKEHOUSE_SPARK_MASTER       Spark master URL (default: local[2])
    LAKEHOUSE_JARS               comma-separated jars for Spark (default: found by `make setup`)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BROKER_PORT = 19092


class ConfigError(ValueError):
    """The environment does not describe a usable platform."""


def lakehouse_home() -> Path:
    return Path(os.environ.get("LAKEHOUSE_HOME", REPO_ROOT / ".lakehouse")).resolve()


def pipelines_dir() -> Path:
    return Path(os.environ.get("LAKEHOUSE_PIPELINES_DIR", REPO_ROOT / "include" / "pipelines")).resolve()


def _stack_state(home: Path) -> dict:
    path = home / "stack.json"
    if path.exists():
        try:
            return json.loads(path.read_text())
        except ValueError:
            return {}
    return {}


@dataclass(frozen=True)
class CatalogConfig:
    """One Iceberg JDBC catalog, seen both by Spark (JDBC URL) and pyiceberg (SQLAlchemy URI)."""

    name: str
    uri: str  # SQLAlchemy URI, e.g. sqlite:////abs/catalog.db or postgresql+psycopg2://u:p@h:5432/db
    warehouse: str

    def jdbc(self) -> tuple[str, dict[str, str]]:
        """The JDBC URL and connection properties Spark's JdbcCatalog needs for `uri`."""
        parts = urlsplit(self.uri)
        scheme = parts.scheme.split("+")[0]
        if scheme == "sqlite":
            path = self.uri.split(":///", 1)[1] if ":///" in self.uri else ""
            if not path:
                raise ConfigError(f"LAKEHOUSE_CATALOG_URI {self.uri!r}: a SQLite catalog needs a file path")
            # Several processes share one SQLite catalog (ingest, replay, maintenance, pyiceberg):
            # WAL so readers never block a commit, and a busy timeout so committers queue.
            return (f"jdbc:sqlite:{path if path.startswith('/') else '/' + path}",
                    {"journal_mode": "WAL", "busy_timeout": "30000"})
        if scheme in ("postgresql", "postgres"):
            props = {}
            if parts.username:
                props["user"] = unquote(parts.username)
            if parts.password:
                props["password"] = unquote(parts.password)
            host = parts.hostname or "127.0.0.1"
            port = parts.port or 5432
            query = f"?{parts.query}" if parts.query else ""
            return f"jdbc:postgresql://{host}:{port}{parts.path}{query}", props
        raise ConfigError(
            f"LAKEHOUSE_CATALOG_URI {self.uri!r}: unsupported database {scheme!r} (use sqlite or postgresql)"
        )


@dataclass(frozen=True)
class PlatformConfig:
    home: Path
    bootstrap_servers: str
    kafka_extra: dict[str, str] = field(default_factory=dict)
    catalog_uri: str = ""
    warehouse: str = ""
    spark_master: str = "local[2]"
    jars: tuple[str, ...] = ()

    def catalog(self, name: str) -> CatalogConfig:
        return CatalogConfig(name=name, uri=self.catalog_uri, warehouse=self.warehouse)

    def kafka(self, **overrides: object) -> dict:
        """librdkafka configuration for any client of this platform."""
        conf = {"bootstrap.servers": self.bootstrap_servers, **self.kafka_extra}
        conf.update(overrides)
        return conf


def _kafka_extra_from_env() -> dict[str, str]:
    extra = {}
    for key, value in os.environ.items():
        if key.startswith("LAKEHOUSE_KAFKA_") and key != "LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS":
            extra[key[len("LAKEHOUSE_KAFKA_"):].lower().replace("_", ".")] = value
    return extra


def default_jars() -> tuple[str, ...]:
    """Iceberg Spark runtime (from the pinned wheel) and the Debian JDBC drivers."""
    jars: list[str] = []
    try:
        import snowpark_connect_deps_iceberg as deps

        runtime = Path(deps.__file__).parent / "jars" / "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
        if runtime.exists():
            jars.append(str(runtime))
    except ImportError:
        pass
    for candidate in ("/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/postgresql.jar"):
        if Path(candidate).exists():
            jars.append(candidate)
    return tuple(jars)


def load() -> PlatformConfig:
    """The platform configuration from the environment and the embedded stack's state file."""
    home = lakehouse_home()
    state = _stack_state(home)
    bootstrap = (
        os.environ.get("LAKEHOUSE_BOOTSTRAP_SERVERS")
        or state.get("bootstrap_servers")
        or f"127.0.0.1:{os.environ.get('LAKEHOUSE_BROKER_PORT') or DEFAULT_BROKER_PORT}"
    )
    catalog_uri = os.environ.get("LAKEHOUSE_CATALOG_URI") or f"sqlite:///{home / 'catalog.db'}"
    warehouse = os.environ.get("LAKEHOUSE_WAREHOUSE") or (home / "warehouse").as_uri()
    jars_env = os.environ.get("LAKEHOUSE_JARS")
    jars = tuple(j for j in jars_env.split(",") if j) if jars_env else default_jars()
    return PlatformConfig(
        home=home,
        bootstrap_servers=bootstrap,
        kafka_extra=_kafka_extra_from_env(),
        catalog_uri=catalog_uri,
        warehouse=warehouse,
        spark_master=os.environ.get("LAKEHOUSE_SPARK_MASTER", "local[2]"),
        jars=jars,
    )
