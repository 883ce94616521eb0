"""The publish in write-audit-publish: move the readers' branch to exactly the audited snapshot.

Ingestion and maintenance commit to `main` (the audit branch). Readers read the
branch `spec.publish.branch` (default `published`) through the Iceberg view
`spec.publish.view`, e.g.

    CREATE VIEW lake.serve.orders AS SELECT * FROM lake.raw.orders VERSION AS OF 'published'

`publish(spec, snapshots)` fast-forwards that branch of every data table to the
snapshot id the audit pinned (not to whatever `main` is by now: ingestion keeps
committing), with a compare-and-set on the branch head so a concurrent publisher
cannot be overwritten. It refuses when the audited snapshot does not descend from
the current published head (a rollback of `main`, an out-of-order run) or is no
longer on `main` (NotADescendantError: audit again), and when an expired snapshot
breaks the chain between them, so that neither can be proven and the rows in between
were not all audited (`LineageBrokenError`, a TableStateError: auditing again
fails the same way; its message says how to publish again). Ancestry is checked with
pyiceberg's lineage helpers through `quality.lineage`, as the audit does. The first
publication creates the branch and the view; a fan-out table `ns.t` gets the view
`<view namespace>.t`.

With `require_verified` (the publish DAG's PublishOperator sets it) publishing is also gated on
exactly-once (`require_verification`): one verification of the chain (lakehouse.audit.verify, incremental
or full; the DAG's `verify` task verifies the audited snapshots) must have verified exactly the
snapshots published, every table at exactly its snapshot id, and the newest such verification must
have passed. Verifications of other snapshots do not count, not even passing ones of each table's
snapshot taken with another snapshot of a sibling table: exactly once holds across the tables of a
pipeline, so each table verified alongside another state of the others proves nothing about the
combination readers would see. Else `UnverifiedError` names the snapshots and what to run,
and no branch moves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

from pyiceberg.catalog.sql import IcebergTables
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from sqlalchemy import select
from sqlalchemy.orm import Session

from lakehouse.audit.verify_model import CHAIN_MODES, HISTORY_EVENTS
from lakehouse.core import config, events, retry
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import NotADescendantError, PublishError, UnverifiedError
from lakehouse.core.naming import fanout_view
from lakehouse.core.spec import PipelineSpec
from lakehouse.wap.quality import lineage

log = logging.getLogger("lakehouse.publish")
# a branch move that lost the catalog's compare-and-set to a commit on `main` is tried again
PUBLISH_ATTEMPTS = 5
PUBLISH_RETRY_S = 0.1


@dataclass(frozen=True)
class PublishedTable:
    table: str
    snapshot_id: int
    previous_snapshot_id: int | None  # the branch head before; None when this publication created it
    view: str | None  # catalog.namespace.view readers query, when the spec declares one

    @property
    def moved(self) -> bool:
        return self.previous_snapshot_id != self.snapshot_id


def view_name(spec: PipelineSpec, table: str) -> str | None:
    """The view (namespace.name) readers use for `table`: spec.publish.view for the default table,
    the same namespace with the table's own name for a fan-out table, None without a view."""
    if spec.publish.view is None:
        return None
    if table == spec.target.table:
        return spec.publish.view
    return fanout_view(spec.publish.view, table)


def view_query(spec: PipelineSpec, table: str | None = None) -> str:
    """The readers' query of `table`'s (default: the main table's) published branch."""
    return f"SELECT * FROM {spec.qualified(table or spec.target.table)} VERSION AS OF '{spec.publish.branch}'"


def current_view_query(spark, view: str) -> str | None:
    """The SQL text behind `view` (catalog.namespace.name), or None when the view does not exist."""
    catalog, namespace, name = view.split(".")
    if not spark.sql(f"SHOW NAMESPACES IN {catalog} LIKE '{namespace}'").collect():
        return None
    if not spark.sql(f"SHOW VIEWS IN {catalog}.{namespace} LIKE '{name}'").collect():
        return None
    statement: str = spark.sql(f"SHOW CREATE TABLE {view}").collect()[0][0]
    _, sep, query = statement.partition("\nAS\n")
    if not sep:
        raise PublishError(f"cannot read the query of view {view} from: {statement!r}")
    return query.strip()


def replace_view(spark, view: str, query: str) -> None:
    """Create or replace `view` (catalog.namespace.name) as `query`; `SELECT *` is expanded now,
    so a view must be replaced to show columns its table gained later."""
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {view.rsplit('.', 1)[0]}")
    spark.sql(f"CREATE OR REPLACE VIEW {view} AS {query}")


def view_exists(catalog, catalog_name: str, view: str) -> bool:
    """Whether the JDBC catalog lists `view` (namespace.name) as a view; pyiceberg's SqlCatalog has no
    view support, so this reads the catalog table Iceberg's JdbcCatalog and pyiceberg share."""
    namespace, name = view.split(".")
    with Session(catalog.engine) as session:
        found = session.execute(select(IcebergTables.iceberg_type).where(
            IcebergTables.catalog_name == catalog_name, IcebergTables.table_namespace == namespace,
            IcebergTables.table_name == name)).first()
    return found is not None and (found[0] or "").upper() == "VIEW"


def published_head(table: Table, branch: str) -> int | None:
    ref = table.metadata.refs.get(branch)
    return ref.snapshot_id if ref else None


def _check(spec: PipelineSpec, table: Table, name: str, snapshot_id: int) -> int | None:
    """The current published head of `table`, after checking `snapshot_id` may be published over it.

    Raises PublishError when the snapshot is not in the table; NotADescendantError when it
    left main or does not descend from the head; LineageBrokenError when an expired
    snapshot breaks the chain from the head to it, or from it to main's head.
    """
    if table.snapshot_by_id(snapshot_id) is None:
        raise PublishError(f"{name}: audited snapshot {snapshot_id} is not in the table (expired?); "
                           f"audit again")
    main = table.current_snapshot()
    if main is None or lineage(spec, table, name, snapshot_id, main.snapshot_id) is None:
        raise NotADescendantError(
            f"{name}: audited snapshot {snapshot_id} is no longer on main (head "
            f"{main.snapshot_id if main else None}): main was rolled back after the audit; audit again")
    head = published_head(table, spec.publish.branch)
    if head is not None and lineage(spec, table, name, head, snapshot_id) is None:
        raise NotADescendantError(
            f"{name}: audited snapshot {snapshot_id} does not descend from the {spec.publish.branch!r} head "
            f"{head}; publishing it would drop data readers already see. Audit main again.")
    return head


def verification_of(spec: PipelineSpec, snapshots: dict[str, int],
                    platform: config.PlatformConfig | None = None) -> dict | None:
    """The newest `verify` event of the chain (an incremental or full run that passed or failed) that
    verified exactly `snapshots` (table -> snapshot id): each of those tables at exactly that snapshot.
    (Other tables it covers, such as the dead letters, may be at any snapshot.) None when there is none.
    `skipped` runs verified nothing themselves and on-demand ranges (`since`, `snapshots`) never prove a
    whole state, so neither counts."""
    wanted = {table: int(sid) for table, sid in snapshots.items()}
    for event in events.recent(spec.name, kind="verify", limit=HISTORY_EVENTS, platform=platform,
                               catalog=spec.catalog):
        details = event["details"] or {}
        if event["status"] not in ("ok", "failed") or details.get("mode") not in CHAIN_MODES:
            continue
        verified = details.get("snapshots") or {}
        try:
            if all(table in verified and int(verified[table]) == sid for table, sid in wanted.items()):
                return event
        except (TypeError, ValueError):  # not a verification's record: it proves nothing
            continue
    return None


def require_verification(spec: PipelineSpec, snapshots: dict[str, int],
                         platform: config.PlatformConfig | None = None) -> dict:
    """The passing verification of exactly `snapshots` (`verification_of`), or UnverifiedError: none
    verified them all at once, or the newest that did failed. The error names the snapshots and what to run."""
    listed = ", ".join(f"{table} snapshot {sid}" for table, sid in snapshots.items())
    found = verification_of(spec, snapshots, platform) if snapshots else None
    if found is not None and found["status"] == "ok":
        return found
    if found is not None:
        raise UnverifiedError(
            f"{spec.name}: the newest verification of exactly {listed} failed ({found['ts']}): "
            f"{(found['message'] or '')[:500]} Fix what it lists, then audit and verify again "
            f"(the DAG {spec.name}_publish does both).")
    raise UnverifiedError(
        f"{spec.name}: no verification verified exactly {listed} together: publishing requires a passing "
        f"verification of the very snapshots it publishes (one of other snapshots, or of each table with "
        f"other snapshots of the others, does not count). Run the DAG {spec.name}_publish again (its `verify` "
        f"task verifies exactly the snapshots it audits), or, when they are still the tables' heads, "
        f"`lakehouse verify --pipeline {spec.name} --full`; if verification fails, fix what it lists first.")


def publish(spec: PipelineSpec, snapshots: dict[str, int], platform: config.PlatformConfig | None = None,
            spark_factory: Callable[[], object] | None = None, record_event: bool = True,
            actor: events.Actor | None = None, forced: bool = False,
            require_verified: bool = False) -> list[PublishedTable]:
    """Fast-forward the readers' branch of each table in `snapshots` (table -> audited snapshot id).

    Every table is checked before any branch moves. Missing views are created with
    Spark (`spark_factory()`, default an in-process session). Unless `record_event` is False,
    records one `publish` event, whatever the outcome, naming `actor` (default: this
    process's) and whether the publication was `forced` past the freshness and lag gates (the
    caller skipped them; the audit always decides). Returns one PublishedTable per table.
    Raises PublishError when `snapshots` is empty, names a table the pipeline does
    not write, or another publisher moved a branch meanwhile; NotADescendantError
    when a snapshot may not be published over the current head;
    LineageBrokenError when expired snapshots leave its ancestry unprovable;
    UnverifiedError, with `require_verified`, when no passing verification verified exactly
    `snapshots` (`require_verification`).
    """
    platform = platform or config.load()
    if not record_event:
        return _publish(spec, snapshots, platform, spark_factory, require_verified)
    parameters = {"snapshots": {table: int(sid) for table, sid in snapshots.items()}, "forced": forced}
    with events.audited(spec.name, "publish", actor or events.Actor.of_process(), parameters, platform,
                        spec.catalog) as audit:
        done = _publish(spec, snapshots, platform, spark_factory, require_verified)
        moved = [p for p in done if p.moved]
        audit.status = "ok" if moved else "skipped"
        audit.message = (f"{spec.name}: {'forced past the SLO gates, ' if forced else ''}published "
                         + ", ".join(f"{p.table} {p.previous_snapshot_id} -> {p.snapshot_id}" for p in moved)
                         if moved else f"{spec.name}: already published, nothing new")
        audit.metrics = {"tables_moved": len(moved)}
        audit.details = {"branch": spec.publish.branch, "tables": [asdict(p) for p in done]}
    return done


def _publish(spec: PipelineSpec, snapshots: dict[str, int], platform: config.PlatformConfig,
             spark_factory: Callable[[], object] | None, require_verified: bool) -> list[PublishedTable]:
    """`publish` without its event: check every table, move the branches, create or evolve the views."""
    if not snapshots:
        raise PublishError(f"{spec.name}: nothing was audited (no table holds data yet)")
    unknown = sorted(set(snapshots) - set(spec.target.tables))
    if unknown:
        raise PublishError(f"{spec.name}: {unknown} are not data tables of the pipeline")
    catalog = open_catalog(platform, spec.catalog)
    loaded = {name: catalog.load_table(name) for name in snapshots}
    heads = {name: _check(spec, loaded[name], name, int(sid)) for name, sid in snapshots.items()}
    if require_verified:  # after the lineage checks: a broken lineage is the first thing to fix
        require_verification(spec, {name: int(sid) for name, sid in snapshots.items()}, platform)
    done = []
    for name, sid in snapshots.items():
        sid = int(sid)
        if heads[name] != sid:
            _move_branch(spec, catalog, loaded[name], name, sid, heads[name])
        done.append(PublishedTable(name, sid, heads[name], view_name(spec, name)))
    # a view fixes its columns when created: (re)create it when missing or when the published
    # schema changed, unless readers were cut over to a candidate (then the view is not ours)
    viewed = [(p, p.view) for p in done if p.view]
    missing = [(p, view) for p, view in viewed if not view_exists(catalog, spec.catalog, view)]
    evolved = [(p, view) for p, view in viewed if (p, view) not in missing and p.previous_snapshot_id is not None
               and _schema_id(loaded[p.table], p.snapshot_id) != _schema_id(loaded[p.table], p.previous_snapshot_id)]
    if missing or evolved:
        spark = spark_factory() if spark_factory else _session(spec, platform)
        for p, view in missing:
            replace_view(spark, spec.qualified(view), view_query(spec, p.table))
        for p, view in evolved:
            if current_view_query(spark, spec.qualified(view)) == view_query(spec, p.table):
                replace_view(spark, spec.qualified(view), view_query(spec, p.table))
    return done


def _move_branch(spec: PipelineSpec, catalog, table: Table, name: str, snapshot_id: int, head: int | None) -> None:
    """Point the readers' branch of `table` at `snapshot_id` where it still points at `head`.

    The commit asserts the branch head (compare-and-set). The catalog also refuses it when
    any other commit to the table (ingestion or compaction on `main`) landed between its
    read of the table and its write; that is retried on the fresh table after checking
    again. Raises PublishError when the branch itself moved (another publisher), or after
    PUBLISH_ATTEMPTS lost races; NotADescendantError when `main` was rolled back meanwhile;
    LineageBrokenError when a snapshot of the chain was expired meanwhile.
    """
    def attempt(number: int) -> None:
        nonlocal table
        try:
            table.manage_snapshots().create_branch(snapshot_id, spec.publish.branch).commit()
        except CommitFailedException as exc:
            table = catalog.load_table(name)
            now = _check(spec, table, name, snapshot_id)
            if now == snapshot_id:  # published meanwhile, by an identical publication
                return
            if now != head:
                raise PublishError(f"{name}: the {spec.publish.branch!r} branch moved from {head} to {now} while "
                                   f"publishing (another publisher?): {exc}") from None
            raise  # a race with another commit to the table only: tried again on the table just loaded

    retry.commit_conflicts(f"publishing {name} to {spec.publish.branch!r}", attempts=PUBLISH_ATTEMPTS,
                           error=PublishError, first_wait_s=PUBLISH_RETRY_S, max_wait_s=1.0,
                           next_step=f"The {spec.publish.branch!r} branch did not move; publish again.").run(attempt)


def _schema_id(table: Table, snapshot_id: int) -> int | None:
    snapshot = table.snapshot_by_id(snapshot_id)
    return snapshot.schema_id if snapshot else None


def _session(spec: PipelineSpec, platform: config.PlatformConfig):
    from lakehouse.core import sparkenv

    return sparkenv.session(platform, [spec.catalog], f"lakehouse-publish-{spec.name}")
