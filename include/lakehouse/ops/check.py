"""`lakehouse check`: whether this machine can run the platform as configured, part by part (as `dbt debug`).

Each part is asked the cheapest question that proves it works, with the clients every command builds
(lakehouse.core.config, topics, catalog, warehouse; the schema registry client of ingest.schema_store), so a
part that passes here passes for the commands too:

    spec            every spec file of the pipelines folder validates (or the one `--pipeline` names)
    kafka           the bootstrap servers answer a metadata request (topics.require_broker)
    object_store    per catalog with an s3:// warehouse: the bucket and the warehouse prefix answer
                    (warehouse.check: a HEAD of the bucket and a one-key listing)
    catalog         per catalog the specs name: it opens and lists its namespaces (catalog.open_catalog)
    schema_registry when LAKEHOUSE_SCHEMA_REGISTRY_URL is set: GET /subjects
    config          only when the LAKEHOUSE_* environment itself does not load (then nothing else is asked)

Every question has a deadline (`timeout`): a part that does not answer in time fails with that
reason instead of holding the command. Nothing is created or altered, except what opening a catalog
creates anyway (a JDBC catalog's own tables, as every command opening it does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from lakehouse.core import config, errors
from lakehouse.core.errors import SpecError
from lakehouse.core.spec import load_pipeline, load_specs

DEFAULT_CATALOG = "lake"  # target.catalog when a spec names none (lakehouse.core.spec): checked without specs

# What to do when a part fails, beside its error's own words.
NEXT = {
    "spec": "fix the field the error names, then run `lakehouse check` again",
    "kafka": "start the broker (the development stack's: `lakehouse stack up`) or point "
             "LAKEHOUSE_BOOTSTRAP_SERVERS (and LAKEHOUSE_KAFKA_* for security) at your cluster",
    "object_store": "check LAKEHOUSE_WAREHOUSE, LAKEHOUSE_S3_ENDPOINT, the AWS credentials and that the bucket exists",
    "catalog": "check LAKEHOUSE_CATALOG_URI (or the pyiceberg configuration of the catalog) and that its "
               "database or server runs",
    "schema_registry": "check LAKEHOUSE_SCHEMA_REGISTRY_URL (credentials go in its user info) and that the "
                       "registry runs",
}


@dataclass
class PartCheck:
    """One part's answer: `status` ok, failed, or skipped (not asked: a part it needs failed before it).
    `target` says which part (never a secret), `detail` what it answered or why it failed, `next` what to do
    when it did not pass, `exit_code` the CLI exit code of its failure (0 when ok)."""

    part: str
    target: str
    status: str
    detail: str
    next: str | None = None
    exit_code: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict:
        return asdict(self) | {"seconds": round(self.seconds, 3)}

    def render(self) -> str:
        line = f"{'ok' if self.ok else self.status.upper():<7} {self.part:<15} {self.target}: {self.detail}"
        return line + (f"; next: {self.next}" if self.next else "")


def _one_line(text: object) -> str:
    """`text` (an error's message) as one line."""
    return " ".join(str(text).split())


def _ask(part: str, target: str, question: Callable[[], str], timeout: float) -> PartCheck:
    """`question()` (what the part answered) within `timeout` seconds, in a thread of its own: a client with
    no deadline of its own (a database driver, an HTTP client) cannot hold the check longer."""
    found: dict = {}

    def run() -> None:
        try:
            found["detail"] = question()
        except Exception as exc:  # noqa: BLE001 - every failure is this part's answer
            found["error"] = exc

    started = time.monotonic()
    worker = threading.Thread(target=run, name=f"check-{part}", daemon=True)
    worker.start()
    worker.join(timeout + 1.0)  # the clients' own deadlines first: their reasons are more precise
    seconds = time.monotonic() - started
    if worker.is_alive():
        return PartCheck(part, target, "failed", f"no answer within {timeout:g}s", NEXT[part],
                         errors.EXIT_FAILURE, seconds)
    if "error" in found:
        exc = found["error"]
        code = exc.exit_code if isinstance(exc, errors.LakehouseError) else errors.EXIT_FAILURE
        shown = _one_line(exc) if isinstance(exc, errors.LakehouseError) else f"{type(exc).__name__}: {_one_line(exc)}"
        return PartCheck(part, target, "failed", shown[:1000], NEXT[part], code, seconds)
    return PartCheck(part, target, "ok", found["detail"], None, 0, seconds)


def _broken(error: SpecError) -> list[PartCheck]:
    """A failed check per mistake of a broken spec file, its target the file and line (`orders.yaml:14`)."""
    return [PartCheck("spec", p.path if p.line is None else f"{p.path}:{p.line}", "failed",
                      _one_line(f"{p.field}: {p.why}" if p.field else p.why), NEXT["spec"], p.exit_code)
            for p in error.problems]


def check_specs(name: str | None) -> tuple[list[PartCheck], list]:
    """A check per spec file (or of pipeline `name`: its file), and the valid specs."""
    if name:
        try:
            spec = load_pipeline(name)
        except SpecError as exc:
            return _broken(exc), []
        except errors.ConfigurationError as exc:  # no file declares `name`
            return [PartCheck("spec", f"pipeline {name}", "failed", _one_line(exc),
                              "give the name of a pipeline the error lists", exc.exit_code)], []
        return [PartCheck("spec", spec.path, "ok", f"pipeline {spec.name} is valid")], [spec]
    found = load_specs()
    checks = [PartCheck("spec", s.path, "ok", f"pipeline {s.name} is valid") for s in found.specs.values()]
    checks += [check for e in found.errors.values() for check in _broken(e)]  # each file's in line order
    if not checks:
        checks.append(PartCheck("spec", str(found.directory), "failed", "no spec file (*.yaml, *.yml) in this folder",
                                "write a pipeline spec there, or point LAKEHOUSE_PIPELINES_DIR at the folder "
                                "that holds yours", errors.EXIT_CONFIG))
    return sorted(checks, key=lambda c: c.target.rpartition(".y")[0]), list(found.specs.values())  # by file


def check_kafka(platform: config.PlatformConfig, specs: list, timeout: float) -> PartCheck:
    from lakehouse.core import kafka_security, topics

    def ask() -> str:
        started = time.monotonic()
        topics.require_broker(platform, timeout)  # its error names the servers and the setting to check
        existing = topics.topic_partitions(platform, max(0.5, timeout - (time.monotonic() - started)))
        missing = sorted({s.source.topic for s in specs} - set(existing))
        return (f"answered: {len(existing)} topic(s)"
                + (f"; not created yet: {', '.join(missing)} (`lakehouse topics` creates them)" if missing else ""))

    return _ask("kafka", kafka_security.describe(platform.kafka()), ask, timeout)


def check_object_store(settings: config.CatalogConfig, timeout: float) -> PartCheck:
    from lakehouse.core import warehouse

    def ask() -> str:
        warehouse.check(settings)
        return f"bucket and warehouse prefix answer (catalog {settings.name})"

    return _ask("object_store", settings.warehouse, ask, timeout)


def check_catalog(platform: config.PlatformConfig, settings: config.CatalogConfig, timeout: float) -> PartCheck:
    from lakehouse.core.catalog import open_catalog

    def ask() -> str:
        namespaces = open_catalog(platform, settings.name, fresh=True).list_namespaces()
        return f"{settings.type} catalog answered: {len(namespaces)} namespace(s)"

    return _ask("catalog", f"{settings.name} at {config.redact(settings.uri) or settings.type}", ask, timeout)


def check_registry(platform: config.PlatformConfig, timeout: float) -> PartCheck:
    from lakehouse.ingest.schema_store import registry_client

    registry = platform.schema_registry() or {}

    def ask() -> str:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        client = registry_client({**registry, "timeout": timeout, "max.retries": 0})
        try:
            subjects = client.get_subjects()
        except SchemaRegistryError as exc:
            why = f"GET /subjects answered HTTP {exc.http_status_code}: {exc.error_message}"
            if exc.http_status_code in (401, 403):  # a credential problem (exit 2), not an outage
                raise errors.SchemaRegistryAccessError(f"{why}: the registry refused these credentials") from None
            raise errors.RetryableError(why) from None
        return f"answered: {len(subjects)} subject(s)"

    return _ask("schema_registry", registry.get("url", ""), ask, timeout)


def check(pipeline: str | None = None, platform: config.PlatformConfig | None = None,
          timeout: float = 5.0) -> list[PartCheck]:
    """Every part's check, in the order a command needs them: specs, Kafka, then per catalog its object store
    and the catalog, then the schema registry when one is configured."""
    spec_checks, specs = check_specs(pipeline)
    checks = list(spec_checks)
    try:
        platform = platform or config.load()
    except errors.ConfigurationError as exc:
        return checks + [PartCheck("config", "environment", "failed", _one_line(exc),
                                   "correct the LAKEHOUSE_* variable the error names", exc.exit_code)]
    checks.append(check_kafka(platform, specs, timeout))
    for name in sorted({s.catalog for s in specs} or {DEFAULT_CATALOG}):
        try:
            settings = platform.catalog(name)
        except errors.ConfigurationError as exc:
            checks.append(PartCheck("catalog", name, "failed", _one_line(exc), NEXT["catalog"], exc.exit_code))
            continue
        if settings.warehouse_on_s3:
            store = check_object_store(settings, timeout)
            checks.append(store)
            if not store.ok:  # the catalog opens only with its warehouse's store
                checks.append(PartCheck("catalog", name, "skipped",
                                        "not asked: it opens only once its warehouse's object store answers",
                                        "fix the object store first"))
                continue
        checks.append(check_catalog(platform, settings, timeout))
    if platform.schema_registry() is not None:
        checks.append(check_registry(platform, timeout))
    return checks
