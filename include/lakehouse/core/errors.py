"""Every error the platform raises on purpose, under one base, `LakehouseError`; and the exit codes.

`EXIT_CODES` is the one table of the `lakehouse` command's exit codes: each class's `exit_code` is one of
its codes, and the CLI's docstring and docs/cli.md say the same (tests/unit/house/test_architecture.py compares
them). The class says what kind of trouble it is, and so what a caller does about it (its exit code in
brackets; a subclass has its parent's unless it says otherwise):

    LakehouseError [1]             base: the CLI prints the message and exits with `exit_code`
      ConfigurationError [2]       a bad spec, setting or argument: fix it and run again (also a ValueError)
        settings, credentials      KafkaAuthError, CatalogAccessError, ObjectStoreAccessError,
                                   SchemaRegistryAccessError, EventError
        the pipeline spec          PatternError, SpecError, UnknownPipelineError (also a LookupError),
                                   BrokenSpecsError (each mistake with its file, line and key path)
        schemas and tables         SchemaTranslationError, SchemaChangeError, WriterSchemaIncompatibleError,
                                   SchemaIncompatibleError, TableOwnershipError, LayoutChangeRefused
        requests refused           TraceError, VerifyError, ReplayError, BackfillError > PlanMismatchError,
                                   CutoverError, QualityConfigError
      SourceError [3]              Kafka cannot serve what the pipeline needs
        topics and offsets         TopicError, TopicMissingError, TopicRecreatedError, OffsetGapError,
                                   SchemaUnknownError
        not answering              BrokerUnavailableError > BrokerStalledError, BrokerUnreachableError;
                                   SchemaRegistryUnavailableError (both also RetryableError)
        retention                  RetentionMisalignedError, RetentionAtRiskError, RetentionChangeRefusedError
      TableStateError [3]          a table is not in a state the pipeline can continue from: PositionsLostError,
                                   UnverifiedError, LineageError > LineageBrokenError, LineageDivergedError
      CommitError [1]              a commit could not be made: IngestError > PlanStaleError (also RetryableError),
                                   EpochTakenError, PublishError > NotADescendantError
        WriterFencedError [4]      another ingest job of the pipeline took over its tables
        commit conflicts           PositionsMovedError (also pyiceberg's CommitFailedException, which the
                                   commit loops retry)
      RetryableError [1]           a transient outage: CatalogUnavailableError, ObjectStoreUnavailableError
      OutageError [1]              a transient failure outlasted the retry budget
      RecordFailureError [1]       a Spark task failed on a record: the batch is read again with it dead-lettered
      MaintenanceError [1]         a maintenance step failed: OwnershipError
      SupervisionError [1]         a job could not be kept alive: JobAlreadyRunningError, JobFencedError

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
from collections.abc import Iterator
from types import MappingProxyType

from pyiceberg.exceptions import CommitFailedException

from lakehouse.core.adapters import pyspark_internals

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_SOURCE, EXIT_FENCED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141  # as shells report a process killed by SIGINT, SIGPIPE

# The exit codes of the `lakehouse` command and what each means: the one table (the CLI's docstring and
# docs/cli.md's "Exit codes" list the same codes with these words first, then examples).
EXIT_CODES = MappingProxyType({
    EXIT_OK: "ok",
    EXIT_FAILURE: "failure",
    EXIT_CONFIG: "a bad spec, setting or argument",
    EXIT_SOURCE: "the source or a table needs attention",
    EXIT_FENCED: "fenced",
    EXIT_INTERRUPTED: "interrupted",
    EXIT_BROKEN_PIPE: "the reader of standard output went away",
})


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


# --- settings and credentials (lakehouse.core.config, kafka_security, events) -------------------------

class KafkaAuthError(ConfigurationError):
    """The Kafka cluster refused this client's credentials or its TLS handshake failed.

    A configuration problem, not a broker outage: retrying with the same settings cannot
    succeed, so callers fail at once instead of polling on.
    """


class EventError(ConfigurationError):
    """An event that does not fit the timeline (unknown kind or status)."""


# --- a spec the tables cannot take (lakehouse.ingest.tables) ---------------------------------------------

class SchemaIncompatibleError(ConfigurationError):
    """The spec changed the contract in a way the table cannot take under the pipeline's policy."""


class TableOwnershipError(ConfigurationError):
    """A table the spec names belongs to another pipeline (or was not created by one)."""


class LayoutChangeRefused(ConfigurationError):
    """The spec changed something its table cannot follow (write mode, upsert key, default table, a
    partition field on a column the table lacks); the message says what to do instead."""


# --- requests a command refuses (trace, verify, replay, backfill, cutover, quality) ------------------------

class TraceError(ConfigurationError):
    """The trace cannot be answered as asked (a partition the topic lacks, a window too large)."""


class VerifyError(ConfigurationError):
    """The verification cannot be run as asked (an unknown snapshot, FROM not before TO); the message
    says why."""


class ReplayError(ConfigurationError):
    """The replay request cannot be served as asked; the message says why."""


class BackfillError(ConfigurationError):
    """The backfill request is invalid or cannot be served; the message says which field and why."""


class PlanMismatchError(BackfillError):
    """The plan about to run is not a plan of the run's request (changed after it was made, or missing)."""


class CutoverError(ConfigurationError):
    """The cutover or rollback was refused; the message says which check failed and by how much."""


class QualityConfigError(ConfigurationError):
    """The expectation suite is missing or unreadable."""


# --- the source: topics, the broker, retention (lakehouse.core.topics, lakehouse.upkeep.retention) --------

class TopicError(SourceError):
    """Kafka refused or could not answer a topic operation (list, describe, create; the topic missing); the
    message says which and why."""


class BrokerUnreachableError(BrokerUnavailableError):
    """Nothing answered at the platform's bootstrap servers within the check's few seconds; the message names
    the servers and the setting to check."""


class RetentionMisalignedError(SourceError):
    """The topic's retention.ms cannot cover lag + outage budget + replay window; the message says by how
    much and which setting fixes it."""


class RetentionAtRiskError(SourceError):
    """Records not yet ingested will age out of Kafka and the guard could not extend the topic's
    retention (no max_retention, the cap reached, or the broker refused); the message says which."""


class RetentionChangeRefusedError(SourceError):
    """The broker refused to change the topic's retention.ms; the message names the missing permission
    (also in `missing_permission` when an ACL is missing)."""

    def __init__(self, message: str, missing_permission: str | None = None):
        super().__init__(message)
        self.missing_permission = missing_permission


# --- table state (lakehouse.core.offsets, lakehouse.audit.verify, lakehouse.wap.quality) -------------------

class PositionsLostError(TableStateError):
    """A table holds rows of the pipeline but none of its snapshots reachable from `main` carries
    the pipeline's positions: resuming would read the topic again and duplicate rows."""


class UnverifiedError(TableStateError):
    """Snapshots about to be published were not verified by a passing verification."""


class LineageError(TableStateError):
    """Main's snapshot cannot be related to the published head, so what is new cannot be known."""


class LineageBrokenError(LineageError):
    """A snapshot between two snapshots of main's lineage was expired: the rows it added cannot be known."""


class LineageDivergedError(LineageError):
    """Main's snapshot does not descend from the published head (main was rolled back below it)."""


# --- commits (lakehouse.ingest.job, lakehouse.ingest.committer, lakehouse.wap.publish) ----------------------

class IngestError(CommitError):
    """The batch could not be committed; the message says why."""


class PlanStaleError(IngestError, RetryableError):
    """A table's positions moved between planning and committing (another commit of the pipeline):
    the batch is planned and written again."""


class EpochTakenError(CommitError):
    """A claim lost to a writer that recorded an equal or higher epoch first."""

    def __init__(self, epoch: int, holder: str):
        super().__init__(f"epoch {epoch} is taken by {holder}")
        self.epoch = epoch


class PositionsMovedError(CommitError, CommitFailedException):
    """Another commit carrying the pipeline's positions landed since the batch was planned (a commit
    conflict: plan again from the table)."""


class PublishError(CommitError):
    """The branch was not moved: nothing audited, an unknown snapshot, or a lost race."""


class NotADescendantError(PublishError):
    """The audited snapshot does not descend from the published head (or left `main`): publishing it
    would make readers lose data they have already seen."""


# --- maintenance and supervision (lakehouse.upkeep.maintenance and .ownership, lakehouse.ops.supervision) -

class MaintenanceError(LakehouseError, RuntimeError):
    """A maintenance step on one table failed (after retries) or broke an invariant; says which and why."""


class OwnershipError(MaintenanceError):
    """Orphan removal refused: the table could not be proven to own every file under its location."""


class SupervisionError(LakehouseError, RuntimeError):
    """The job could not be kept alive (restarts exhausted, or its processes would not die)."""


class JobAlreadyRunningError(SupervisionError):
    """Another job of the same pipeline holds the pipeline's job lock."""


class JobFencedError(SupervisionError):
    """The job exited because a newer ingest job of the pipeline claimed its tables (exit code 4):
    restarting it would only fence the other job in turn."""


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


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
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
        pass
    else:
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            return f"catalog connection lost: {exc.orig}"
    try:
        import psycopg2
    except ImportError:  # pragma: no cover
        pass
    else:
        if isinstance(exc, psycopg2.Error):
            code = exc.pgcode or ""
            if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)) \
                    or _SQLSTATE_TRANSIENT.match(code):
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
    return java if java is not None else pyspark_internals.captured_java_exception(exc)


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
        gateway = pyspark_internals.gateway()
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
            gateway = pyspark_internals.gateway()
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


# --- the pipeline spec (lakehouse.core.spec) ----------------------------------------------------

class PatternError(ConfigurationError):
    """A contract pattern the platform does not run; the message says why and what to write instead."""


class SpecError(ConfigurationError):
    """A pipeline spec file is invalid: each mistake names the file, the YAML line (when it is about one
    value), the field's key path and why, `orders.yaml:14: contract.fields[amount].type: ...`.

    A file with several mistakes raises one SpecError holding each as `problems` (one SpecError per
    mistake, in line order), its message one line per mistake; `field`, `why` and `line` are the first's.
    """

    def __init__(self, path: object, field_path: str, why: str, line: int | None = None,
                 problems: tuple[SpecError, ...] = ()):
        self.path = str(path)
        self.field = field_path
        self.why = why
        self.line = line
        self.problems: tuple[SpecError, ...] = tuple(problems) or (self,)
        own = f"{self.path}{'' if line is None else f':{line}'}: {field_path}: {why}"
        super().__init__("\n".join(own if p is self else str(p) for p in self.problems))

    @classmethod
    def of(cls, problems: list[SpecError]) -> SpecError:
        """One SpecError for the mistakes `problems` of one file (at least one), ordered by line (those
        about the file as a whole first), the first one's field and why in front."""
        ordered = sorted(problems, key=lambda p: p.line or 0)
        if len(ordered) == 1:
            return ordered[0]
        first = ordered[0]
        return cls(first.path, first.field, first.why, first.line, problems=tuple(ordered))


class UnknownPipelineError(ConfigurationError, LookupError):
    """No spec file declares the pipeline asked for."""


class BrokenSpecsError(ConfigurationError):
    """Some spec files of the pipelines folder do not load; the message lists every mistake of each."""

    def __init__(self, errors: dict[str, SpecError]):
        self.errors = dict(errors)
        super().__init__(f"{len(errors)} pipeline spec file(s) do not load, so their pipelines are left out "
                         f"until fixed:\n" + "\n".join(f"- {p}" for e in errors.values() for p in e.problems))
