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
    LAKEHOUSE_SCHEMA_REGISTRY_URL  Confluent-compatible schema registry of Avro pipelines, e.g.
                                 https://user:secret@registry:8081 (credentials in the URL's user
                                 info are sent as HTTP basic auth and never printed) (default: none;
                                 pipelines then read writer schemas from their `source.schemas` folder)
    LAKEHOUSE_SPARK_MASTER       Spark master URL (default: the standalone master that
                                 `lakehouse stack up --spark-cluster` started, else local[2])
    LAKEHOUSE_JARS               comma-separated jars for Spark (default: found by `make setup`)
    LAKEHOUSE_CATALOG_BUSY_TIMEOUT_MS  SQLite catalog: how long a commit waits for another
                                 process's lock (default 30000)
    Unit prices `lakehouse cost` prices a pipeline's use with (default: none, quantities only; read
    here, checked by lakehouse.ops.cost where they are used, so a bad one stops only that command):
    LAKEHOUSE_PRICE_OBJECT_STORE_GB_MONTH  object-store storage per GiB-month
    LAKEHOUSE_PRICE_KAFKA_GB_MONTH         broker storage per GiB-month
    LAKEHOUSE_PRICE_PUT_PER_1000           1,000 object-store writes
    LAKEHOUSE_PRICE_GET_PER_1000           1,000 object-store reads
    LAKEHOUSE_PRICE_COMPUTE_HOUR           an hour of a job's executors
    LAKEHOUSE_PRICE_CURRENCY               the prices' currency, a label such as EUR

An s3:// (or s3a://) warehouse is read and written through Iceberg's S3FileIO
(Spark) and pyarrow (pyiceberg). These optional variables describe the object
store; any other warehouse ignores them (a malformed value is an error all the same):

    LAKEHOUSE_S3_ENDPOINT          S3 API endpoint, e.g. http://minio:9000 (default: AWS S3)
    LAKEHOUSE_S3_PATH_STYLE_ACCESS true for http://endpoint/bucket/key addressing (MinIO);
                                   false for bucket.endpoint (default: the client's own)
    LAKEHOUSE_S3_REGION            the bucket's region, e.g. us-east-1 (default: the AWS SDK's
                                   region chain on the JVM side, a lookup of the bucket in pyiceberg)

Credentials are not platform settings: both sides take them from the standard AWS
chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the environment of the driver and
of every executor, a profile, or an instance role), so they never appear in Spark's
configuration, its UI or its event logs.

Kafka security is librdkafka configuration like any other property: for a secured
cluster set LAKEHOUSE_KAFKA_SECURITY_PROTOCOL (SASL_SSL, SASL_PLAINTEXT, SSL),
LAKEHOUSE_KAFKA_SASL_MECHANISM (SCRAM-SHA-512 ...), LAKEHOUSE_KAFKA_SASL_USERNAME,
LAKEHOUSE_KAFKA_SASL_PASSWORD and LAKEHOUSE_KAFKA_SSL_CA_LOCATION. Every client (admin,
producers, the planner and the readers in Spark tasks, status, sensors) gets them
through `PlatformConfig.kafka()`. When the embedded broker runs with authentication or
TLS (`lakehouse stack up --auth scram-sha-512 --tls`), the development stack tells `load()`
(entry point `lakehouse.settings`, lakehouse_dev.settings) how to reach it (protocol,
mechanism, user, the CA, the generated password from an owner-only file under
LAKEHOUSE_HOME); `load()` gives clients those settings, and LAKEHOUSE_KAFKA_* variables
override them. Secret values are never printed: use
`redact_kafka()` for any Kafka configuration that goes into output, and
`PlatformConfig`'s repr leaves the Kafka properties out.

The repr (and str) of `PlatformConfig`, `CatalogConfig` and `ObjectStoreConfig` show URIs
through `redact()`, so a catalog URI's password never reaches a log. What Airflow may write
into a Spark job's templated `env_vars` (stored and shown in its UI) is an allow-list kept
here: `ENVIRONMENT`, `JOB_ENVIRONMENT` (the other variables the Spark jobs read) and the
LAKEHOUSE_KAFKA_<PROP> variables of `PUBLIC_KAFKA_PROPERTIES`, each only when its value holds
no URI password (`holds_password`); see `lakehouse_airflow.spark`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass, field, fields, replace
from importlib.metadata import entry_points
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from lakehouse.core.errors import ConfigurationError

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_BROKER_PORT = 19092
# The Iceberg Spark runtime the project is built and tested with (Spark 3.5, Scala 2.12);
# networked builds fetch the same version by Maven coordinates (docker/Dockerfile).
ICEBERG_RUNTIME_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
# Warehouse URI schemes served by S3FileIO; the LAKEHOUSE_S3_* settings apply to them only.
S3_SCHEMES = ("s3", "s3a")
KAFKA_PREFIX = "LAKEHOUSE_KAFKA_"
# Every variable this module reads (plus the KAFKA_PREFIX family), so a deployment
# (docker-compose.yaml) can be checked for settings nothing reads.
# Unit prices of `lakehouse cost` (lakehouse.ops.cost.UnitPrices): stored as given, checked where used.
PRICE_ENVIRONMENT = (
    "LAKEHOUSE_PRICE_OBJECT_STORE_GB_MONTH",
    "LAKEHOUSE_PRICE_KAFKA_GB_MONTH",
    "LAKEHOUSE_PRICE_PUT_PER_1000",
    "LAKEHOUSE_PRICE_GET_PER_1000",
    "LAKEHOUSE_PRICE_COMPUTE_HOUR",
    "LAKEHOUSE_PRICE_CURRENCY",
)
ENVIRONMENT = (
    "LAKEHOUSE_HOME",
    "LAKEHOUSE_PIPELINES_DIR",
    "LAKEHOUSE_BOOTSTRAP_SERVERS",
    "LAKEHOUSE_BROKER_PORT",
    "LAKEHOUSE_CATALOG_URI",
    "LAKEHOUSE_WAREHOUSE",
    "LAKEHOUSE_SPARK_MASTER",
    "LAKEHOUSE_SCHEMA_REGISTRY_URL",
    "LAKEHOUSE_JARS",
    "LAKEHOUSE_CATALOG_BUSY_TIMEOUT_MS",
    "LAKEHOUSE_S3_ENDPOINT",
    "LAKEHOUSE_S3_PATH_STYLE_ACCESS",
    "LAKEHOUSE_S3_REGION",
    *PRICE_ENVIRONMENT,
)
# Variables the Spark jobs read besides ENVIRONMENT: sizing and logging (lakehouse.core.sparkenv), the
# metrics port (lakehouse.cli), test fault injection (lakehouse.core.hooks: the test suite's hook file and the
# fault it injects) and PySpark's interpreters.
JOB_ENVIRONMENT = (
    "LAKEHOUSE_SPARK_CORES_MAX",
    "LAKEHOUSE_SPARK_EXECUTOR_CORES",
    "LAKEHOUSE_SPARK_EXECUTOR_MEMORY",
    "LAKEHOUSE_SHUFFLE_PARTITIONS",
    "LAKEHOUSE_SPARK_UI",
    "LAKEHOUSE_SPARK_LOG_LEVEL",
    "LAKEHOUSE_SPARK_JAVA_OPTIONS",
    "LAKEHOUSE_METRICS_PORT",
    "LAKEHOUSE_TEST_HOOKS",
    "LAKEHOUSE_FAULT",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
)
# librdkafka properties that never hold a secret: of the LAKEHOUSE_KAFKA_<PROP> variables only these
# may be written where people read them (Airflow's templated env_vars). Passwords, keys and key
# stores, JAAS and OAuth configurations, and any property missing here stay in the process environment.
PUBLIC_KAFKA_PROPERTIES = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.kerberos.service.name",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "client.id",
    "client.rack",
    "broker.address.family",
)


class ConfigError(ConfigurationError):
    """The environment does not describe a usable platform."""


# librdkafka properties whose values are secrets (plus any property whose name says so).
SENSITIVE_KAFKA_PROPERTIES = frozenset({
    "sasl.password", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config",
    "sasl.oauthbearer.assertion.private.key.passphrase", "sasl.oauthbearer.assertion.private.key.pem",
    "ssl.key.password", "ssl.key.pem", "ssl.keystore.password", "ssl.truststore.password",
})
_SENSITIVE_WORDS = ("password", "secret", "passphrase", "private.key")


def is_sensitive_kafka_property(name: str) -> bool:
    """Whether librdkafka property `name` holds a secret (a password, a private key, a client secret)."""
    name = name.lower()
    return name in SENSITIVE_KAFKA_PROPERTIES or any(word in name for word in _SENSITIVE_WORDS)


def redact_kafka(conf: dict) -> dict:
    """A copy of the librdkafka configuration `conf` fit for output: secret values are ***,
    callables (error_cb, a logger) are named, not shown."""
    out = {}
    for key, value in conf.items():
        if is_sensitive_kafka_property(str(key)):
            out[key] = "***"
        elif callable(value) or isinstance(value, logging.Logger):
            out[key] = f"<{getattr(value, '__name__', type(value).__name__)}>"
        else:
            out[key] = value
    return out


# A URI's password: from the ':' after the user name to the last '@'. SQLAlchemy accepts an
# unescaped '/', '?', '#' or '@' in it, where urlsplit would see no password and print it in clear.
_URI_PASSWORD = re.compile(r"^(?P<head>[\x00-\x20]*[\w+.:-]+://[^:/]*:)(?P<password>.+)@", re.DOTALL)
# A secret given as a query parameter instead (psycopg2 takes ?password=...).
_QUERY_SECRET = re.compile(r"(?P<head>[?&][^=&#]*(?:password|passwd|secret|token)[^=&#]*=)[^&#]*", re.IGNORECASE)
# Characters urlsplit drops anywhere in a URL before parsing it.
_URL_IGNORED = str.maketrans("", "", "\t\r\n")


def redact(uri: str) -> str:
    """`uri` with its password (if any) replaced by ***, for output and error messages."""
    return _QUERY_SECRET.sub(r"\g<head>***", _URI_PASSWORD.sub(r"\g<head>***@", uri, count=1))


def holds_password(value: str) -> bool:
    """Whether `value` holds a password `redact` would mask (a URI's user info or a password-like
    query parameter), also once the tabs and newlines urlsplit ignores are taken out."""
    return any(_URI_PASSWORD.match(text) or _QUERY_SECRET.search(text)
               for text in (value, value.translate(_URL_IGNORED)))


def kafka_property(variable: str) -> str:
    """The librdkafka property a LAKEHOUSE_KAFKA_<PROP> `variable` sets, e.g. LAKEHOUSE_KAFKA_SASL_USERNAME:
    sasl.username."""
    return variable[len(KAFKA_PREFIX):].lower().replace("_", ".")


def _redacted_repr(self) -> str:
    """The dataclass repr of `self` with every string shown through `redact` (no URI password);
    fields declared repr=False (the Kafka properties) stay out."""
    shown = []
    for f in fields(self):
        if f.repr:
            value = getattr(self, f.name)
            shown.append(f"{f.name}={(redact(value) if isinstance(value, str) else value)!r}")
    return f"{type(self).__name__}({', '.join(shown)})"


def lakehouse_home() -> Path:
    return Path(os.environ.get("LAKEHOUSE_HOME", REPO_ROOT / ".lakehouse")).resolve()


def pipelines_dir() -> Path:
    return Path(os.environ.get("LAKEHOUSE_PIPELINES_DIR", REPO_ROOT / "include" / "pipelines")).resolve()


@dataclass(frozen=True)
class CatalogConfig:
    """One Iceberg JDBC catalog, seen both by Spark (JDBC URL) and pyiceberg (SQLAlchemy URI)."""

    name: str
    uri: str  # SQLAlchemy URI, e.g. sqlite:////abs/catalog.db or postgresql+psycopg2://u:p@h:5432/db
    warehouse: str
    busy_timeout_ms: int = 30_000  # SQLite: how long a commit waits for another process's lock

    __repr__ = _redacted_repr  # the URI may hold the database password

    def jdbc(self) -> tuple[str, dict[str, str]]:
        """The JDBC URL and connection properties Spark's JdbcCatalog needs for `uri`."""
        parts = urlsplit(self.uri)
        scheme = parts.scheme.split("+")[0]
        if scheme == "sqlite":
            path = self.uri.split(":///", 1)[1] if ":///" in self.uri else ""
            if not path:
                raise ConfigError(f"LAKEHOUSE_CATALOG_URI {redact(self.uri)!r}: a SQLite catalog needs a file path")
            # Several processes share one SQLite catalog (ingest, replay, maintenance, pyiceberg):
            # WAL so readers never block a commit, and a busy timeout so committers queue.
            return (f"jdbc:sqlite:{path if path.startswith('/') else '/' + path}",
                    {"journal_mode": "WAL", "busy_timeout": str(self.busy_timeout_ms)})
        if scheme in ("postgresql", "postgres"):
            props = {}
            if parts.username:
                props["user"] = unquote(parts.username)
            if parts.password:
                props["password"] = unquote(parts.password)
            host = parts.hostname or "127.0.0.1"
            port = parts.port or 5432
            # a password given as a query parameter becomes a connection property too: the JDBC URL is
            # shown in Spark's UI and logs, the `jdbc.password` property is redacted there
            params = []
            for key, value in parse_qsl(parts.query, keep_blank_values=True):
                if key in ("user", "password"):
                    props[key] = value
                else:
                    params.append((key, value))
            query = f"?{urlencode(params)}" if params else ""
            return f"jdbc:postgresql://{host}:{port}{parts.path}{query}", props
        raise ConfigError(
            f"LAKEHOUSE_CATALOG_URI {redact(self.uri)!r}: unsupported database {scheme!r} (use sqlite or postgresql)"
        )


@dataclass(frozen=True)
class ObjectStoreConfig:
    """How to reach the S3-compatible store of an s3:// warehouse (never its credentials).

    Unset fields are left to the clients' own defaults (the AWS endpoint, virtual-host
    addressing, the region chain).
    """

    endpoint: str | None = None
    path_style_access: bool | None = None
    region: str | None = None

    __repr__ = _redacted_repr  # an endpoint URL may carry user:password@

    def iceberg_properties(self) -> dict[str, str]:
        """Catalog properties of Iceberg's Java S3FileIO (spark.sql.catalog.<name>.<property>)."""
        props = {"io-impl": "org.apache.iceberg.aws.s3.S3FileIO"}
        if self.endpoint:
            props["s3.endpoint"] = self.endpoint
        if self.path_style_access is not None:
            props["s3.path-style-access"] = "true" if self.path_style_access else "false"
        if self.region:
            props["client.region"] = self.region
        return props

    def pyiceberg_properties(self) -> dict[str, str]:
        """The same settings as pyiceberg (0.12) names them for its pyarrow S3 FileIO."""
        props = {}
        if self.endpoint:
            props["s3.endpoint"] = self.endpoint
        if self.path_style_access is not None:
            # pyiceberg says it the other way round: virtual addressing on or off
            props["s3.force-virtual-addressing"] = "false" if self.path_style_access else "true"
        if self.region:
            props["s3.region"] = self.region  # also stops pyiceberg asking AWS where the bucket is
        return props


@dataclass(frozen=True)
class PlatformConfig:
    home: Path
    bootstrap_servers: str
    # left out of repr: it may hold sasl.password (see redact_kafka for output)
    kafka_extra: dict[str, str] = field(default_factory=dict, repr=False)
    catalog_uri: str = ""
    warehouse: str = ""
    spark_master: str = "local[2]"
    jars: tuple[str, ...] = ()
    object_store: ObjectStoreConfig = field(default_factory=ObjectStoreConfig)
    catalog_busy_timeout_ms: int = 30_000
    schema_registry_url: str | None = None
    prices: dict[str, str] = field(default_factory=dict)  # the LAKEHOUSE_PRICE_* variables set, unchecked

    __repr__ = _redacted_repr  # catalog_uri and schema_registry_url may hold a password

    def schema_registry(self) -> dict | None:
        """confluent-kafka SchemaRegistryClient settings (user info of the URL as basic auth: never
        print them), or None when no registry is configured."""
        if not self.schema_registry_url:
            return None
        parts = urlsplit(self.schema_registry_url)
        conf = {"url": parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()}
        if parts.username:
            conf["basic.auth.user.info"] = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        return conf

    def catalog(self, name: str) -> CatalogConfig:
        return CatalogConfig(name=name, uri=self.catalog_uri, warehouse=self.warehouse,
                             busy_timeout_ms=self.catalog_busy_timeout_ms)

    @property
    def warehouse_on_s3(self) -> bool:
        """Whether the warehouse is an s3:// or s3a:// location (read and written with S3FileIO)."""
        return urlsplit(self.warehouse).scheme in S3_SCHEMES

    def kafka(self, **overrides: object) -> dict:
        """librdkafka configuration for any client of this platform (secrets included: never print
        it, print `redact_kafka(conf)`)."""
        conf = {"bootstrap.servers": self.bootstrap_servers, **self.kafka_extra}
        conf.update(overrides)
        return conf

    def with_kafka(self, settings: dict) -> "PlatformConfig":
        """This platform with the librdkafka `settings` laid over its Kafka configuration
        (`bootstrap.servers` among them replaces the bootstrap servers); e.g. an Airflow connection's."""
        if not settings:
            return self
        extra = {k: str(v) for k, v in settings.items() if k != "bootstrap.servers" and v is not None}
        return replace(self, bootstrap_servers=str(settings.get("bootstrap.servers") or self.bootstrap_servers),
                       kafka_extra={**self.kafka_extra, **extra})


def _kafka_extra_from_env() -> dict[str, str]:
    extra = {}
    for key, value in os.environ.items():
        if key.startswith(KAFKA_PREFIX) and key != "LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS":
            extra[kafka_property(key)] = value
    return extra


def default_jars() -> tuple[str, ...]:
    """Iceberg Spark runtime (from the pinned wheel) and the Debian JDBC drivers."""
    jars: list[str] = []
    try:
        import snowpark_connect_deps_iceberg as deps

        runtime = Path(deps.__file__).parent / "jars" / ICEBERG_RUNTIME_JAR
        if runtime.exists():
            jars.append(str(runtime))
    except ImportError:
        pass
    for candidate in ("/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/postgresql.jar"):
        if Path(candidate).exists():
            jars.append(candidate)
    return tuple(jars)


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def parse_bool(raw: str | None, name: str, default: bool | None = None) -> bool | None:
    """The boolean setting `name` from its text (true/false, 1/0, yes/no, on/off); `default` when
    unset or empty. Raises ConfigError for anything else."""
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name} {raw!r}: expected true or false")


def _object_store_from_env() -> ObjectStoreConfig:
    """The LAKEHOUSE_S3_* settings. Raises ConfigError for an endpoint that is not an http(s)
    URL or a path-style flag that is not a boolean."""
    endpoint = os.environ.get("LAKEHOUSE_S3_ENDPOINT") or None
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"LAKEHOUSE_S3_ENDPOINT {endpoint!r}: expected an http(s) URL such as "
                              f"http://minio:9000")
    path_style = parse_bool(os.environ.get("LAKEHOUSE_S3_PATH_STYLE_ACCESS"), "LAKEHOUSE_S3_PATH_STYLE_ACCESS")
    return ObjectStoreConfig(endpoint=endpoint, path_style_access=path_style,
                             region=os.environ.get("LAKEHOUSE_S3_REGION") or None)


def _schema_registry_from_env() -> str | None:
    """LAKEHOUSE_SCHEMA_REGISTRY_URL: an http(s) URL, or mock://<scope> (confluent-kafka's in-process
    test double); None when unset. Raises ConfigError for anything else."""
    url = os.environ.get("LAKEHOUSE_SCHEMA_REGISTRY_URL") or None
    if url is not None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "mock") or not parts.hostname:
            raise ConfigError(f"LAKEHOUSE_SCHEMA_REGISTRY_URL {redact(url)!r}: expected an http(s) URL such as "
                              f"http://registry:8081")
    return url


def _busy_timeout_from_env() -> int:
    """LAKEHOUSE_CATALOG_BUSY_TIMEOUT_MS: how long a SQLite catalog commit waits for another process's
    lock before failing (the ingest job then retries it within its retry budget); default 30 s."""
    raw = os.environ.get("LAKEHOUSE_CATALOG_BUSY_TIMEOUT_MS") or "30000"
    if not raw.strip().isdigit() or not 1 <= int(raw) <= 3_600_000:
        raise ConfigError(f"LAKEHOUSE_CATALOG_BUSY_TIMEOUT_MS {raw!r}: expected milliseconds between 1 and 3600000")
    return int(raw)


def _prices_from_env() -> dict[str, str]:
    """The LAKEHOUSE_PRICE_* variables that are set, as given (lakehouse.ops.cost checks them)."""
    found = {
        "LAKEHOUSE_PRICE_OBJECT_STORE_GB_MONTH": os.environ.get("LAKEHOUSE_PRICE_OBJECT_STORE_GB_MONTH"),
        "LAKEHOUSE_PRICE_KAFKA_GB_MONTH": os.environ.get("LAKEHOUSE_PRICE_KAFKA_GB_MONTH"),
        "LAKEHOUSE_PRICE_PUT_PER_1000": os.environ.get("LAKEHOUSE_PRICE_PUT_PER_1000"),
        "LAKEHOUSE_PRICE_GET_PER_1000": os.environ.get("LAKEHOUSE_PRICE_GET_PER_1000"),
        "LAKEHOUSE_PRICE_COMPUTE_HOUR": os.environ.get("LAKEHOUSE_PRICE_COMPUTE_HOUR"),
        "LAKEHOUSE_PRICE_CURRENCY": os.environ.get("LAKEHOUSE_PRICE_CURRENCY"),
    }
    return {name: value for name, value in found.items() if value and value.strip()}


_LOADED: dict[tuple, PlatformConfig] = {}
_LOADED_LOCK = threading.Lock()
_PROVIDERS: list | None = None


def _environment_key() -> tuple:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("LAKEHOUSE_", "PYSPARK_"))))


def _stack_providers() -> list:
    """The installed `lakehouse.settings` entry points (the development stack's), loaded once per process."""
    global _PROVIDERS
    if _PROVIDERS is None:
        _PROVIDERS = [entry.load() for entry in entry_points(group="lakehouse.settings")]
    return _PROVIDERS


def stack_settings(home: Path) -> dict:
    """What a running development stack says about itself (entry points `lakehouse.settings`, installed by
    the `lakehouse-devstack` distribution): `bootstrap_servers`, `kafka` (librdkafka security settings)
    and `spark_master`, each only when that part of the stack runs. {} in a product-only install."""
    settings: dict = {}
    for provider in _stack_providers():
        settings.update(provider.settings(home) or {})
    return settings


def load(fresh: bool = False) -> PlatformConfig:
    """The platform configuration: the LAKEHOUSE_* variables, then what a running development stack
    says (`stack_settings`), then the defaults.

    One object per process while the environment and the stack stay as they are: later calls return
    it without reading anything again (each stack provider's `version(home)` is a cheap check, e.g.
    the modification times of its state files, so a stack started or stopped by another process is
    seen); `fresh` reads everything again."""
    home = lakehouse_home()
    key = (_environment_key(), tuple(provider.version(home) for provider in _stack_providers()))
    with _LOADED_LOCK:
        if not fresh and key in _LOADED:
            return _LOADED[key]
    stack = stack_settings(home)
    external = os.environ.get("LAKEHOUSE_BOOTSTRAP_SERVERS")
    bootstrap = (
        external
        or stack.get("bootstrap_servers")
        or f"127.0.0.1:{os.environ.get('LAKEHOUSE_BROKER_PORT') or DEFAULT_BROKER_PORT}"
    )
    # the embedded broker's own security settings, under any the environment gives
    kafka_extra = {**({} if external else stack.get("kafka") or {}), **_kafka_extra_from_env()}
    catalog_uri = os.environ.get("LAKEHOUSE_CATALOG_URI") or f"sqlite:///{home / 'catalog.db'}"
    warehouse = os.environ.get("LAKEHOUSE_WAREHOUSE") or (home / "warehouse").as_uri()
    jars_env = os.environ.get("LAKEHOUSE_JARS")
    jars = tuple(j for j in jars_env.split(",") if j) if jars_env else default_jars()
    platform = PlatformConfig(
        home=home,
        bootstrap_servers=bootstrap,
        kafka_extra=kafka_extra,
        catalog_uri=catalog_uri,
        warehouse=warehouse,
        spark_master=os.environ.get("LAKEHOUSE_SPARK_MASTER") or stack.get("spark_master") or "local[2]",
        jars=jars,
        catalog_busy_timeout_ms=_busy_timeout_from_env(),
        object_store=_object_store_from_env(),
        schema_registry_url=_schema_registry_from_env(),
        prices=_prices_from_env(),
    )
    with _LOADED_LOCK:
        _LOADED[key] = platform
    return platform
