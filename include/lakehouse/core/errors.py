"""Every error the platform raises on purpose derives from `LakehouseError`.

The subclasses say what kind of trouble it is, and so what a caller does about it:

    ConfigurationError   a bad spec, setting or argument: fix it and run again (CLI exit 2)
    SourceError          Kafka cannot serve what the pipeline needs (CLI exit 3)
    TableStateError      a table is not in a state the pipeline can continue from (CLI exit 3)
    CommitError          a commit could not be made (CLI exit 1)
    WriterFencedError    another ingest job of the pipeline took over its tables (CLI exit 4)
    RetryableError       a transient outage (catalog locked or unreachable, broker stalled)

Retryability is decided from types, never from words in a message: `transient_cause(exc)`
walks an exception's causes and recognises the database drivers' connection and lock
errors (SQLite busy/locked, PostgreSQL connection loss and shutdown), librdkafka's
retriable errors, `RetryableError`, and, for errors raised in the JVM (Spark, Iceberg's
JDBC catalog), the Java exception types of the same failures. Errors raised inside Spark
tasks reach the driver as text; they carry a `[lakehouse:...]` marker (`task_marker`) that
`marker_in` reads back.
"""

from __future__ import annotations

import re
import sqlite3

EXIT_FAILURE, EXIT_CONFIG, EXIT_SOURCE, EXIT_FENCED = 1, 2, 3, 4


class LakehouseError(Exception):
    """Base of every error the platform raises on purpose."""

    exit_code = EXIT_FAILURE


class ConfigurationError(LakehouseError, ValueError):
    """A spec, setting or argument is invalid; the message says which and why."""

    exit_code = EXIT_CONFIG


class SchemaTranslationError(ConfigurationError):
    """A writer schema holds a construct the contract cannot express (lakehouse.core.schemas); the
    message names the field path and what is not supported."""


class SchemaChangeError(ConfigurationError):
    """A reader task met a compatible writer schema that a contract following the writer schemas does not
    hold yet: the ingest job evolves the table and writes the batch again (a task marker `schema-change`
    names the schema id). Escaping a job, it means: run ingestion, which evolves the table, first."""


class WriterSchemaIncompatibleError(ConfigurationError):
    """A writer schema does not fit the contract and `schema_policy.on_incompatible` is `fail`."""


class SchemaRegistryAccessError(ConfigurationError):
    """The schema registry refused the platform's credentials (HTTP 401 or 403): waiting does not fix
    that, so the job stops at once instead of spending its retry budget; nothing is dead-lettered."""


class CatalogAccessError(ConfigurationError):
    """The catalog refused this client (HTTP 401 or 403 from a REST catalog): its credentials or grants are
    wrong, not a transient outage; the message names the setting to fix."""


class ObjectStoreAccessError(ConfigurationError):
    """The object store of an s3:// warehouse refused the platform's credentials, or has no such bucket:
    waiting does not fix that; the message names the setting to fix."""


class SourceError(LakehouseError, RuntimeError):
    """Kafka cannot serve what the pipeline needs; the message says what and why."""

    exit_code = EXIT_SOURCE


class TableStateError(LakehouseError, RuntimeError):
    """A table is not in a state the pipeline can safely continue from (positions lost, foreign
    owner); the message says what happened and how to recover."""

    exit_code = EXIT_SOURCE


class CommitError(LakehouseError, RuntimeError):
    """A commit could not be made; the message says why."""


class WriterFencedError(CommitError):
    """Another ingest job of the same pipeline claimed its tables (a newer writer epoch): this
    job must stop committing, as Kafka fences a zombie producer."""

    exit_code = EXIT_FENCED


class RetryableError(LakehouseError, RuntimeError):
    """A transient outage: the same work may succeed when tried again later."""


class CatalogUnavailableError(RetryableError):
    """The catalog did not answer, or failed on its side (a REST catalog down, HTTP 5xx): transient, retried
    within the retry budget."""


class ObjectStoreUnavailableError(RetryableError):
    """Nothing answered at the object store's endpoint, or it failed on its side: transient, retried within
    the retry budget."""


class SchemaUnknownError(SourceError):
    """A reader task met a writer schema id it was not shipped: the ingest job's driver resolves it in the
    schema registry and writes the batch again (a task marker `schema-unknown` names the id)."""


class TopicMissingError(SourceError):
    """The pipeline's topic does not exist on the cluster."""


class OffsetGapError(SourceError):
    """Records the pipeline has not ingested were deleted from Kafka (retention)."""


class TopicRecreatedError(SourceError):
    """The topic's offsets went backwards or its id changed: it was deleted and recreated."""


class BrokerUnavailableError(SourceError, RetryableError):
    """The broker did not answer in time (metadata, watermarks, the log-end probe; stalled,
    restarting, unreachable): the ingest job retries the batch within its retry budget."""


class SchemaRegistryUnavailableError(SourceError, RetryableError):
    """The schema registry did not answer (outage, timeout, a server error) while a record's writer
    schema was needed: the batch is retried within the retry budget, then the job stops; the records
    are never dead-lettered for it. Raised in Spark tasks with a `retryable` task marker."""


class BrokerStalledError(BrokerUnavailableError):
    """A Spark task's planned records did not come (a stalled, restarting or unreachable broker).

    Transient: the message carries a `retryable` task marker, since the driver sees a
    task's error as text only.
    """


class RecordFailureError(LakehouseError, RuntimeError):
    """A Spark task failed in a way it did not expect while reading a record.

    The message starts with a `record-failure` task marker naming the topic, partition and
    offset, so that the driver can read the batch again with that record dead-lettered.
    """


class OutageError(LakehouseError, RuntimeError):
    """A transient failure lasted longer than the retry budget allowed; the job gave up."""


# --- what is transient --------------------------------------------------------------------------

_SQLITE_TRANSIENT = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED
# SQLSTATE classes of a lost or refused connection (08), an operator intervention such as
# pg_terminate_backend or a server shutdown (57P0x), and serialization failures (40001)
_SQLSTATE_TRANSIENT = re.compile(r"^(08|57P0|40001)")
_JAVA_TRANSIENT = (
    "java.sql.SQLTransientException",
    "java.sql.SQLRecoverableException",
    "java.net.SocketException",
    "java.net.SocketTimeoutException",
    "java.net.http.HttpConnectTimeoutException",
    "org.apache.iceberg.exceptions.CommitStateUnknownException",
    # a REST catalog that is down, overloaded or failing (HTTP 5xx, 429; the connection refused)
    "org.apache.iceberg.exceptions.ServiceUnavailableException",
    "org.apache.iceberg.exceptions.ServiceFailureException",
)


def _causes(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _python_transient(exc: BaseException) -> str | None:
    if isinstance(exc, RetryableError):
        return str(exc)
    if isinstance(exc, sqlite3.OperationalError) and (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF \
            in _SQLITE_TRANSIENT:
        return f"SQLite catalog busy: {exc}"
    try:
        from sqlalchemy.exc import DBAPIError
    except ImportError:  # pragma: no cover - sqlalchemy comes with pyiceberg[sql]
        DBAPIError = ()  # type: ignore[assignment]
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return f"catalog connection lost: {exc.orig}"
    try:
        import psycopg2
    except ImportError:  # pragma: no cover
        psycopg2 = None
    if psycopg2 is not None and isinstance(exc, psycopg2.Error):
        code = exc.pgcode or ""
        if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)) or _SQLSTATE_TRANSIENT.match(code):
            return f"PostgreSQL catalog unavailable: {str(exc).strip()}"
    found = _rest_transient(exc)
    if found:
        return found
    try:
        from confluent_kafka import KafkaError, KafkaException
    except ImportError:  # pragma: no cover
        return None
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err = exc.args[0]
        if err.retriable() or err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                                             KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT):
            return f"Kafka: {err.str()}"
    return None


def _rest_transient(exc: BaseException) -> str | None:
    """A REST catalog (pyiceberg's client) that did not answer, is overloaded or failed on its side: the
    connection refused or timed out, HTTP 5xx or 429. A commit whose outcome it could not tell
    (CommitStateUnknownException) is retried by planning again from the tables, which say whether it landed."""
    try:
        import requests
        from pyiceberg.exceptions import (
            CommitStateUnknownException,
            ServerError,
            ServiceUnavailableError,
            TooManyRequestsError,
        )
    except ImportError:  # pragma: no cover - both come with pyiceberg
        return None
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return f"REST catalog unreachable: {exc}"
    if isinstance(exc, (ServiceUnavailableError, ServerError, TooManyRequestsError, CommitStateUnknownException)):
        return f"REST catalog: {type(exc).__name__}: {exc}"
    return None


def _java_exception(exc: BaseException):
    """The JVM exception behind a py4j or PySpark error, else None."""
    java = getattr(exc, "java_exception", None)  # py4j.protocol.Py4JJavaError
    return java if java is not None else getattr(exc, "_origin", None)  # pyspark's CapturedException


def _java_class(gateway, name: str):
    """The JVM class `name` as Spark loads it (jars added with spark.jars live in Spark's class loader,
    which Class.forName alone does not search), or None when it is not on the classpath."""
    jvm = gateway.jvm
    try:
        return jvm.java.lang.Class.forName(name, False, jvm.java.lang.Thread.currentThread().getContextClassLoader())
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        return None


def _java_transient(java) -> str | None:
    """Whether the JVM exception `java` (or a cause of it) is a transient catalog failure."""
    try:
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        if gateway is None:
            return None
        transient = [c for c in (_java_class(gateway, name) for name in _JAVA_TRANSIENT) if c is not None]
        sql_exception = _java_class(gateway, "java.sql.SQLException")
        sqlite = _java_class(gateway, "org.sqlite.SQLiteException")
        depth, cause = 0, java
        while cause is not None and depth < 12:
            if any(t.isInstance(cause) for t in transient):
                return f"{cause.getClass().getName()}: {cause.getMessage()}"
            if sql_exception.isInstance(cause):
                state = cause.getSQLState() or ""
                code = cause.getErrorCode()
                # SQLite reports extended result codes (SQLITE_BUSY_SNAPSHOT is 517): the low byte is the code
                if _SQLSTATE_TRANSIENT.match(state) or (sqlite is not None and sqlite.isInstance(cause)
                                                       and code & 0xFF in _SQLITE_TRANSIENT):
                    return f"{cause.getClass().getName()}: {cause.getMessage()}"
            cause, depth = cause.getCause(), depth + 1
    except Exception:  # noqa: BLE001 - a JVM that is gone cannot tell; treat as not transient
        return None
    return None


# Iceberg's optimistic-concurrency failures: another commit won; reload and try again
_JAVA_CONFLICTS = (
    "org.apache.iceberg.exceptions.CommitFailedException",
    "org.apache.iceberg.exceptions.ValidationException",
)


def java_instance_of(exc: BaseException, *class_names: str) -> str | None:
    """The name of the first of `class_names` that the JVM exception behind `exc` (or one of its Java
    causes) is an instance of; None for Python errors or when none matches."""
    for cause in _causes(exc):
        java = _java_exception(cause)
        if java is None:
            continue
        try:
            from pyspark import SparkContext

            gateway = SparkContext._gateway
            if gateway is None:
                return None
            classes = [(name, cls) for name in class_names if (cls := _java_class(gateway, name)) is not None]
            depth, found = 0, java
            while found is not None and depth < 12:
                for name, cls in classes:
                    if cls.isInstance(found):
                        return name
                found, depth = found.getCause(), depth + 1
        except Exception:  # noqa: BLE001 - a JVM that is gone cannot tell
            return None
    return None


def commit_conflict(exc: BaseException) -> bool:
    """Whether `exc` is Iceberg's report that another commit won the race (pyiceberg or Java)."""
    from pyiceberg.exceptions import CommitFailedException

    if any(isinstance(cause, CommitFailedException) for cause in _causes(exc)):
        return True
    return java_instance_of(exc, *_JAVA_CONFLICTS) is not None


def transient_cause(exc: BaseException) -> str | None:
    """A short description of the transient failure behind `exc` (a lost or locked catalog, a
    stalled broker), or None when retrying cannot help."""
    for cause in _causes(exc):
        found = _python_transient(cause)
        if found:
            return found
        java = _java_exception(cause)
        if java is not None:
            found = _java_transient(java)
            if found:
                return found
        marker = marker_in(str(cause))
        if marker and marker[0] == "retryable":
            return marker[1].get("why", "transient failure in a Spark task")
    return None


# --- markers for errors raised inside Spark tasks ----------------------------------------------

_MARKER = re.compile(r"\[lakehouse:(?P<kind>[a-z-]+)(?P<fields>(?: [a-z_]+=[^\s\]]*)*)\]")


def task_marker(kind: str, **fields: object) -> str:
    """A `[lakehouse:KIND k=v ...]` tag for the message of an error raised in a Spark task, which
    reaches the driver only as text; values must not contain spaces or ']'."""
    return "[lakehouse:" + kind + "".join(f" {k}={v}" for k, v in fields.items()) + "]"


def marker_in(text: str) -> tuple[str, dict[str, str]] | None:
    """The first `[lakehouse:...]` marker in `text` as (kind, fields), or None."""
    match = _MARKER.search(text or "")
    if not match:
        return None
    fields = dict(item.split("=", 1) for item in match.group("fields").split())
    return match.group("kind"), fields
