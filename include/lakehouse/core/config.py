"""Where things are: the platform's environment, read once from variables.

Every component (CLI, Spark job, tests, later the DAGs) asks this module for the
Kafka bootstrap servers, the Iceberg catalog and the warehouse, so pointing the
platform at a real cluster is a matter of environment variables only:

    LAKEHOUSE_HOME               state folder of the embedded stack (default: <repo>/.lakehouse)
    LAKEHOUSE_PIPELINES_DIR      folder of pipeline YAML specs (default: <repo>/include/pipelines)
    LAKEHOUSE_EXPECTATIONS_DIR   folder of the publish audits' expectation suites (default: <repo>/include/expectations)
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
    LAKEHOUSE_SPARK_PACKAGES     more Maven coordinates for spark.jars.packages, comma-separated, after
                                 SPARK_PACKAGES (Iceberg's Spark runtime and AWS bundle, the JDBC drivers)
    LAKEHOUSE_SPARK_CONF         more Spark properties, a JSON object such as {"spark.executor.memory": "4g"};
                                 they win over the platform's own (shown in Spark's UI: no secrets)
    LAKEHOUSE_JARS               comma-separated local jars for spark.jars (default: none)
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
# What Spark loads by Maven coordinates (spark.jars.packages), as every Spark user writes it: Iceberg's Spark
# runtime for Spark 3.5 / Scala 2.12 (the newest release that runs on PySpark 3.5 and Java 17), Iceberg's AWS
# bundle (S3FileIO and the AWS SDK it needs, shaded) and the JDBC drivers of the JDBC catalogs. `make setup`
# resolves them into ~/.m2 once, where Spark's Ivy finds them offline; the image (docker/Dockerfile) fetches
# the same coordinates.
ICEBERG_VERSION = "1.10.1"
SPARK_PACKAGES = (
    f"org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:{ICEBERG_VERSION}",
    f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_VERSION}",
    "org.xerial:sqlite-jdbc:3.49.1.0",  # 3.50 imports a BOM that Ivy looks for as a jar (online)
    "org.postgresql:postgresql:42.7.7",
)
_COORDINATE = re.compile(r"[A-Za-z0-9_.-]+:[A-Za-z0-9_.-]+:[A-Za-z0-9_.+-]+")
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
    "LAKEHOUSE_EXPECTATIONS_DIR",
    "LAKEHOUSE_BOOTSTRAP_SERVERS",
    "LAKEHOUSE_BROKER_PORT",
    "LAKEHOUSE_CATALOG_URI",
    "LAKEHOUSE_WAREHOUSE",
    "LAKEHOUSE_SPARK_MASTER",
    "LAKEHOUSE_SCHEMA_REGISTRY_URL",
    "LAKEHOUSE_SPARK_PACKAGES",
    "LAKEHOUSE_SPARK_CONF",
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
    "LAKEHOUSE_SPARK_CLASS_ARCHIVE",
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


def kafka_variable(prop: str) -> str:
    """The LAKEHOUSE_KAFKA_<PROP> variable that sets librdkafka property `prop` (`kafka_property` reads it back)."""
    return KAFKA_PREFIX + prop.upper().replace(".", "_")


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


def expectations_dir() -> Path:
    """The folder of the expectation suites (`<suite>.json`) the publish audits validate with."""
    return Path(os.environ.get("LAKEHOUSE_EXPECTATIONS_DIR", REPO_ROOT / "include" / "expectations")).resolve()


@dataclass(frozen=True)
class ObjectStoreConfig:
    """How to reach the S3-compatible store of an s3:// warehouse.

    Unset fields are left to the clients' own defaults (the AWS endpoint, virtual-host addressing, the
    region chain, the AWS credentials chain). Credentials are set only for a store the development stack
    runs (its generated key); a real deployment leaves them to the AWS chain (environment, profile,
    instance role) on the driver and every executor, so they never appear in Spark's configuration.
    """

    endpoint: str | None = None
    path_style_access: bool | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)

    __repr__ = _redacted_repr  # an endpoint URL may carry user:password@

    def iceberg_properties(self) -> dict[str, str]:
        """Catalog properties of Iceberg's Java S3FileIO (spark.sql.catalog.<name>.<property>), credentials
        left out (the JVM takes them from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, see `aws_environment`)."""
        props = {"io-impl": "org.apache.iceberg.aws.s3.S3FileIO"}
        if self.endpoint:
            props["s3.endpoint"] = self.endpoint
        if self.path_style_access is not None:
            props["s3.path-style-access"] = "true" if self.path_style_access else "false"
        if self.region:
            props["client.region"] = self.region
        return props

    def pyiceberg_properties(self) -> dict[str, str]:
        """The same settings as pyiceberg (0.12) names them for its pyarrow S3 FileIO, credentials included,
        and that FileIO writing small files in one request each (lakehouse.core.fileio)."""
        props = {"py-io-impl": "lakehouse.core.fileio.DelayedOpenFileIO"}
        if self.endpoint:
            props["s3.endpoint"] = self.endpoint
        if self.path_style_access is not None:
            # pyiceberg says it the other way round: virtual addressing on or off
            props["s3.force-virtual-addressing"] = "false" if self.path_style_access else "true"
        if self.region:
            props["s3.region"] = self.region  # also stops pyiceberg asking AWS where the bucket is
        if self.access_key_id and self.secret_access_key:
            props.update({"s3.access-key-id": self.access_key_id, "s3.secret-access-key": self.secret_access_key})
        return props

    def environment(self) -> dict[str, str]:
        """The variables that give a process started from this one (spark-submit) this store: the
        LAKEHOUSE_S3_* settings `load()` reads back, and the credentials (`aws_environment`)."""
        env = {}
        if self.endpoint:
            env["LAKEHOUSE_S3_ENDPOINT"] = self.endpoint
        if self.path_style_access is not None:
            env["LAKEHOUSE_S3_PATH_STYLE_ACCESS"] = "true" if self.path_style_access else "false"
        if self.region:
            env["LAKEHOUSE_S3_REGION"] = self.region
        return {**env, **self.aws_environment()}

    def aws_environment(self) -> dict[str, str]:
        """The AWS SDK's variables for the credentials set here (the JVM side reads them from its environment)."""
        if not (self.access_key_id and self.secret_access_key):
            return {}
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}


# The catalog types the platform reads and writes through, by the names Iceberg users write (`type:`);
# pyiceberg calls a JDBC catalog `sql`.
CATALOG_TYPES = ("jdbc", "rest", "glue", "hive")
_PYICEBERG_TYPES = {"jdbc": "sql", "rest": "rest", "glue": "glue", "hive": "hive"}
# Catalog properties only pyiceberg knows (its FileIO); Spark's Java catalog gets the equivalents or nothing.
_PYICEBERG_ONLY = ("py-io-impl", "pyarrow.", "s3.force-virtual-addressing", "s3.region", "downcast-ns-timestamp")
# Properties whose values are secrets: never shown (repr, status, Spark's UI redacts them by its regex).
_SECRET_PROPERTY = re.compile(r"(?i)secret|password|token|credential|private|access-key")


@dataclass(frozen=True)
class CatalogConfig:
    """One Iceberg catalog by name, as Spark (a SparkCatalog) and pyiceberg both open it.

    `type` is jdbc, rest, glue or hive; `uri` a SQLAlchemy URI (jdbc: sqlite or postgresql), an http(s)
    URL (rest), a thrift URI (hive) or empty (glue); `warehouse` this catalog's own location (tables of
    two catalogs never share a directory); `properties` everything else, by the names pyiceberg and
    Iceberg's Java catalogs share (credential, token, scope, header.*, io-impl, s3.*, ...): secrets among
    them are never shown. `source` says where the settings came from.
    """

    name: str
    type: str
    uri: str
    warehouse: str
    properties: dict[str, str] = field(default_factory=dict, repr=False)
    object_store: ObjectStoreConfig = field(default_factory=ObjectStoreConfig)
    busy_timeout_ms: int = 30_000  # SQLite: how long a commit waits for another process's lock
    source: str = "LAKEHOUSE_CATALOG_URI"

    __repr__ = _redacted_repr  # the URI may hold the database password

    @property
    def warehouse_on_s3(self) -> bool:
        """Whether the warehouse is an s3:// or s3a:// location (read and written with S3FileIO)."""
        return urlsplit(self.warehouse).scheme in S3_SCHEMES

    def shown_properties(self) -> dict[str, str]:
        """`properties` fit for output: secret values as ***."""
        return {k: ("***" if _SECRET_PROPERTY.search(k) else v) for k, v in self.properties.items()}

    def jdbc(self) -> tuple[str, dict[str, str]]:
        """The JDBC URL and connection properties Spark's JdbcCatalog needs for `uri` (type jdbc)."""
        parts = urlsplit(self.uri)
        scheme = parts.scheme.split("+")[0]
        if scheme == "sqlite":
            path = self.uri.split(":///", 1)[1] if ":///" in self.uri else ""
            if not path:
                raise ConfigurationError(f"catalog {self.name!r} ({self.source}): {redact(self.uri)!r}: a SQLite "
                                         f"catalog needs a file path")
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
        raise ConfigurationError(f"catalog {self.name!r} ({self.source}): {redact(self.uri)!r}: unsupported database "
                                 f"{scheme!r} (use sqlite or postgresql)")

    def pyiceberg_properties(self) -> dict[str, str]:
        """The properties `pyiceberg.catalog.load_catalog(name, **props)` opens this catalog with."""
        props: dict[str, str] = {"type": _PYICEBERG_TYPES[self.type]}
        uri = self.uri
        if self.type == "jdbc":
            if uri.startswith("sqlite:") and "?" not in uri:  # wait for another process's lock as Spark does
                uri += f"?timeout={self.busy_timeout_ms / 1000:g}"
            # a pooled connection the server dropped (restart, pg_terminate_backend) is replaced before use
            props["pool_pre_ping"] = "true"
        if uri:
            props["uri"] = uri
        if self.warehouse:
            props["warehouse"] = self.warehouse
        if self.warehouse_on_s3 or self.type != "jdbc":
            props.update(self.object_store.pyiceberg_properties())
        props.update(self.properties)
        return props

    def spark_properties(self) -> dict[str, str]:
        """`spark.sql.catalog.<name>.<property>` of this catalog, without the prefix ("" is the catalog's
        class). Secrets are there too: Spark's UI redacts them (see sparkenv's spark.redaction.regex)."""
        conf = {"": "org.apache.iceberg.spark.SparkCatalog",
                # another writer (compaction, a replay) may commit between batches: always load fresh
                "cache-enabled": "false"}
        if self.type == "jdbc":
            jdbc_url, jdbc_props = self.jdbc()
            conf.update({
                "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog", "uri": jdbc_url, "jdbc.schema-version": "V1",
                # pyiceberg creates the catalog tables (see sparkenv.session()); Iceberg's own initialisation
                # leaves a ResultSet open, which on SQLite pins a read snapshot so that every later commit
                # from this JVM fails with SQLITE_BUSY_SNAPSHOT once another process wrote
                "jdbc.init-catalog-tables": "false",
                **{f"jdbc.{key}": value for key, value in jdbc_props.items()}})
        else:
            conf["type"] = self.type
            if self.uri:
                conf["uri"] = self.uri
        if self.warehouse:
            conf["warehouse"] = self.warehouse
        if self.warehouse_on_s3:
            conf.update(self.object_store.iceberg_properties())
        for key, value in self.properties.items():
            if key.startswith(_PYICEBERG_ONLY):
                continue
            conf[key] = value
        return conf


@dataclass(frozen=True)
class PlatformConfig:
    home: Path
    bootstrap_servers: str
    # left out of repr: it may hold sasl.password (see redact_kafka for output)
    kafka_extra: dict[str, str] = field(default_factory=dict, repr=False)
    catalog_uri: str = ""
    warehouse: str = ""
    spark_master: str = "local[2]"
    spark_packages: tuple[str, ...] = SPARK_PACKAGES
    spark_conf: dict[str, str] = field(default_factory=dict)  # LAKEHOUSE_SPARK_CONF: the user's own properties
    jars: tuple[str, ...] = ()  # local jars for spark.jars (LAKEHOUSE_JARS)
    object_store: ObjectStoreConfig = field(default_factory=ObjectStoreConfig)
    catalog_busy_timeout_ms: int = 30_000
    schema_registry_url: str | None = None
    prices: dict[str, str] = field(default_factory=dict)  # the LAKEHOUSE_PRICE_* variables set, unchecked
    # pyiceberg's own configuration of catalogs by name (.pyiceberg.yaml, PYICEBERG_CATALOG__<NAME>__<PROP>):
    # left out of repr, it may hold credentials
    catalog_settings: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    warehouse_explicit: bool = False  # LAKEHOUSE_WAREHOUSE was set (a REST catalog is then told it)

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
        """Catalog `name` as Spark and pyiceberg open it: pyiceberg's configuration of that name when there is
        one (`.pyiceberg.yaml`, PYICEBERG_CATALOG__<NAME>__<PROP>), else the platform's: LAKEHOUSE_CATALOG_URI
        (a jdbc catalog for sqlite or postgresql, a rest catalog for http(s)). A jdbc catalog's warehouse is
        `<warehouse>/<name>` unless configured: catalogs sharing a database never share a table directory;
        a rest catalog's locations are its server's (LAKEHOUSE_WAREHOUSE, when set, is passed on).
        Raises ConfigurationError for a type or URI the platform cannot open."""
        settings = dict(self.catalog_settings.get(name) or {})
        source = f"pyiceberg configuration of catalog {name!r}" if settings else "LAKEHOUSE_CATALOG_URI"
        uri = str(settings.pop("uri", "" if settings else self.catalog_uri) or "")
        kind = str(settings.pop("type", "") or "").lower() or _catalog_type(uri, source)
        kind = {"sql": "jdbc"}.get(kind, kind)
        if kind not in CATALOG_TYPES:
            raise ConfigurationError(f"catalog {name!r} ({source}): type {kind!r} is not one of "
                                     f"{', '.join(CATALOG_TYPES)}")
        warehouse = str(settings.pop("warehouse", "") or "")
        if not warehouse and kind == "jdbc":
            warehouse = f"{self.warehouse.rstrip('/')}/{name}"
        elif not warehouse and self.warehouse_explicit:
            warehouse = self.warehouse
        return CatalogConfig(name=name, type=kind, uri=uri, warehouse=warehouse,
                             properties={k: str(v) for k, v in settings.items()}, object_store=self.object_store,
                             busy_timeout_ms=self.catalog_busy_timeout_ms, source=source)

    @property
    def warehouse_on_s3(self) -> bool:
        """Whether the warehouse is an s3:// or s3a:// location (read and written with S3FileIO)."""
        return urlsplit(self.warehouse).scheme in S3_SCHEMES

    def kafka(self, **overrides: object) -> dict:
        """librdkafka configuration for any client of this platform (secrets included: never print
        it, print `redact_kafka(conf)`)."""
        conf: dict[str, object] = {"bootstrap.servers": self.bootstrap_servers, **self.kafka_extra}
        conf.update(overrides)
        return conf

    def with_kafka(self, settings: dict) -> PlatformConfig:
        """This platform with the librdkafka `settings` laid over its Kafka configuration
        (`bootstrap.servers` among them replaces the bootstrap servers); e.g. an Airflow connection's."""
        if not settings:
            return self
        extra = {k: str(v) for k, v in settings.items() if k != "bootstrap.servers" and v is not None}
        return replace(self, bootstrap_servers=str(settings.get("bootstrap.servers") or self.bootstrap_servers),
                       kafka_extra={**self.kafka_extra, **extra})


def _catalog_type(uri: str, source: str) -> str:
    """The catalog type a URI implies: jdbc for a SQLAlchemy sqlite or postgresql URI, rest for http(s)."""
    found = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", uri)  # not urlsplit: it refuses a '[' in a password
    scheme = found.group(1).split("+")[0].lower() if found else ""
    if scheme in ("sqlite", "postgresql", "postgres"):
        return "jdbc"
    if scheme in ("http", "https"):
        return "rest"
    raise ConfigurationError(f"{source} {redact(uri)!r}: expected a SQLAlchemy URI of the JDBC catalog's database "
                             f"(sqlite:///..., postgresql+psycopg2://...) or the http(s) URL of a REST catalog; other "
                             f"catalogs (glue, hive) are configured by name in .pyiceberg.yaml or PYICEBERG_CATALOG__*")


def _pyiceberg_catalogs() -> dict[str, dict[str, str]]:
    """pyiceberg's configuration of catalogs by name: `.pyiceberg.yaml` (in PYICEBERG_HOME, the home folder or
    the working folder) and PYICEBERG_CATALOG__<NAME>__<PROP> variables, as pyiceberg itself reads them."""
    from pyiceberg.utils.config import Config

    found = Config().config.get("catalog") or {}
    if not isinstance(found, dict):
        raise ConfigurationError(f"pyiceberg's configuration (.pyiceberg.yaml or PYICEBERG_CATALOG__<NAME>__<PROP>): "
                                 f"`catalog` must map each catalog name to its properties, got {str(found)[:80]!r}")
    return {str(name): {str(k): str(v) for k, v in (props or {}).items()}
            for name, props in found.items() if isinstance(props, dict)}


def _kafka_extra_from_env() -> dict[str, str]:
    extra = {}
    for key, value in os.environ.items():
        if key.startswith(KAFKA_PREFIX) and key != "LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS":
            extra[kafka_property(key)] = value
    return extra


def _spark_packages_from_env() -> tuple[str, ...]:
    """SPARK_PACKAGES, then the coordinates of LAKEHOUSE_SPARK_PACKAGES (group:artifact:version, comma-separated).
    Raises ConfigurationError for anything that is not a Maven coordinate."""
    extra = [c.strip() for c in (os.environ.get("LAKEHOUSE_SPARK_PACKAGES") or "").split(",") if c.strip()]
    for coordinate in extra:
        if not _COORDINATE.fullmatch(coordinate):
            raise ConfigurationError(f"LAKEHOUSE_SPARK_PACKAGES: {coordinate!r} is not a Maven coordinate "
                                     f"group:artifact:version, e.g. org.apache.hadoop:hadoop-aws:3.3.4")
    return tuple(dict.fromkeys((*SPARK_PACKAGES, *extra)))


def _spark_conf_from_env() -> dict[str, str]:
    """LAKEHOUSE_SPARK_CONF: a JSON object of Spark properties (string, number or boolean values), {} when unset.
    Raises ConfigurationError for anything else."""
    import json

    raw = os.environ.get("LAKEHOUSE_SPARK_CONF") or ""
    if not raw.strip():
        return {}
    try:
        found = json.loads(raw)
    except ValueError as exc:
        raise ConfigurationError(f"LAKEHOUSE_SPARK_CONF is not JSON ({exc}); write an object such as "
                                 f'{{"spark.executor.memory": "4g"}}') from None
    if not isinstance(found, dict) or not all(
            isinstance(k, str) and k.startswith("spark.") and isinstance(v, (str, int, float, bool))
            for k, v in found.items()):
        raise ConfigurationError('LAKEHOUSE_SPARK_CONF must be a JSON object of Spark properties ("spark.*") to '
                                 'strings, numbers or booleans, e.g. {"spark.executor.memory": "4g"}')
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in found.items()}


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def parse_bool(raw: str | None, name: str, default: bool | None = None) -> bool | None:
    """The boolean setting `name` from its text (true/false, 1/0, yes/no, on/off); `default` when
    unset or empty. Raises ConfigurationError for anything else."""
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"{name} {raw!r}: expected true or false")


def _object_store_from_env(stack: dict) -> ObjectStoreConfig:
    """The LAKEHOUSE_S3_* settings over what a running stack's object store says (`stack`: endpoint, region,
    path_style_access and its generated credentials). Raises ConfigurationError for an endpoint that is not an
    http(s) URL or a path-style flag that is not a boolean."""
    if os.environ.get("LAKEHOUSE_S3_ENDPOINT") is None and stack.get("endpoint"):
        return ObjectStoreConfig(endpoint=stack["endpoint"], path_style_access=stack.get("path_style_access"),
                                 region=stack.get("region"), access_key_id=stack.get("access_key_id"),
                                 secret_access_key=stack.get("secret_access_key"))
    endpoint = os.environ.get("LAKEHOUSE_S3_ENDPOINT") or None
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"LAKEHOUSE_S3_ENDPOINT {endpoint!r}: expected an http(s) URL such as "
                                     f"http://minio:9000")
    path_style = parse_bool(os.environ.get("LAKEHOUSE_S3_PATH_STYLE_ACCESS"), "LAKEHOUSE_S3_PATH_STYLE_ACCESS")
    return ObjectStoreConfig(endpoint=endpoint, path_style_access=path_style,
                             region=os.environ.get("LAKEHOUSE_S3_REGION") or None)


def _schema_registry_from_env() -> str | None:
    """LAKEHOUSE_SCHEMA_REGISTRY_URL: an http(s) URL, or mock://<scope> (confluent-kafka's in-process
    test double); None when unset. Raises ConfigurationError for anything else."""
    url = os.environ.get("LAKEHOUSE_SCHEMA_REGISTRY_URL") or None
    if url is not None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "mock") or not parts.hostname:
            raise ConfigurationError(f"LAKEHOUSE_SCHEMA_REGISTRY_URL {redact(url)!r}: expected an http(s) URL "
                                     f"such as http://registry:8081")
    return url


def _busy_timeout_from_env() -> int:
    """LAKEHOUSE_CATALOG_BUSY_TIMEOUT_MS: how long a SQLite catalog commit waits for another process's
    lock before failing (the ingest job then retries it within its retry budget); default 30 s."""
    raw = os.environ.get("LAKEHOUSE_CATALOG_BUSY_TIMEOUT_MS") or "30000"
    if not raw.strip().isdigit() or not 1 <= int(raw) <= 3_600_000:
        raise ConfigurationError(f"LAKEHOUSE_CATALOG_BUSY_TIMEOUT_MS {raw!r}: expected milliseconds between 1 and "
                                 f"3600000")
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
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.startswith(("LAKEHOUSE_", "PYSPARK_", "PYICEBERG_", "AWS_"))))


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
    # the environment's settings win over what the running stack says (its REST catalog, S3 store, registry)
    catalog_uri = os.environ.get("LAKEHOUSE_CATALOG_URI") or stack.get("catalog_uri") \
        or f"sqlite:///{home / 'catalog.db'}"
    explicit = os.environ.get("LAKEHOUSE_WAREHOUSE") or stack.get("warehouse")
    warehouse = explicit or (home / "warehouse").as_uri()
    jars = tuple(j.strip() for j in (os.environ.get("LAKEHOUSE_JARS") or "").split(",") if j.strip())
    platform = PlatformConfig(
        home=home,
        bootstrap_servers=bootstrap,
        kafka_extra=kafka_extra,
        catalog_uri=catalog_uri,
        warehouse=warehouse,
        spark_master=os.environ.get("LAKEHOUSE_SPARK_MASTER") or stack.get("spark_master") or "local[2]",
        spark_packages=_spark_packages_from_env(),
        spark_conf=_spark_conf_from_env(),
        jars=jars,
        catalog_busy_timeout_ms=_busy_timeout_from_env(),
        object_store=_object_store_from_env(stack.get("object_store") or {}),
        schema_registry_url=_schema_registry_from_env() or stack.get("schema_registry_url"),
        prices=_prices_from_env(),
        catalog_settings=_pyiceberg_catalogs(),
        warehouse_explicit=bool(explicit),
    )
    with _LOADED_LOCK:
        _LOADED[key] = platform
    return platform
