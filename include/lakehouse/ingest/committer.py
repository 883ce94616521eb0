"""The one place an ingest commit becomes visible: a fenced, compare-and-set move of `main`.

Both kinds of commit are one catalog commit whose requirements are checked against exactly
the metadata the catalog swaps, so nothing can slip in between check and commit. A JDBC (or
Glue, Hive) catalog is pyiceberg's MetastoreCatalog: it validates every requirement, the
lakehouse's own among them, inside the compare-and-set on the metadata location. A REST
catalog checks only the REST protocol's requirements on its server: there the lakehouse's own
are validated against the metadata the commit is built on, and the commit carries the
protocol's `assert-ref-snapshot-id` on `main` at that metadata, so the server refuses it (409,
retried by the caller as any conflict) when anything moved `main` since (`as_checked_by`).

A batch's tables commit together, in one request, where the catalog offers multi-table commits
(a REST catalog that lists `POST /v1/{prefix}/transactions/commit` among its endpoints:
`commits_together`, `commit_together`): the server checks every table's requirements before it
commits any, so a conflict, a fence or a crash leaves all of them as they were, never the data
tables ahead of the dead-letter table. Elsewhere each table commits on its own, in order; the
positions each table records make a batch cut short between two commits resume exactly once.

- an append table's commit is `append_files`: the data files the Spark tasks wrote become
  one new snapshot on `main` (pyiceberg writes the manifests; no rows pass through here);
- an upsert table's commit is the same call with position deletes beside the files
  (`append_files` with `deletes`): Iceberg's row delta, one `overwrite` snapshot that adds the
  batch's winning rows and deletes the rows they replace (lakehouse.ingest.row_deltas), written
  by the driver; the tombstone ledger's own commit is `commit_files`.

Requirements of both:
- `main` is still where the commit was built on (no other commit landed since; otherwise
  the caller appends again on the new head, or merges again);
- `PipelineFence`: the table is still claimed by this job's writer, and the newest
  commit carrying the pipeline's positions is still the one the batch was planned from.

Writers are fenced as Kafka fences zombie producers: `Writer.claim` gives a starting
ingest job a writer epoch above every epoch recorded on the pipeline's tables and
records it (with the writer's id) as table properties, one compare-and-set per table.
From then on a job whose id is no longer on a table is a zombie: its commits fail with
WriterFencedError, however long it was paused, whichever host it runs on.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, TypeGuard

from pydantic import Field
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import Endpoint, HttpMethod, RestCatalog
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import CommitTableRequest, Table, TableIdentifier, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetPropertiesUpdate,
    ValidatableTableRequirement,
)
from requests import HTTPError

from lakehouse.core import offsets, retry
from lakehouse.core.adapters import pyiceberg_internals
from lakehouse.core.errors import (
    CommitError,
    EpochTakenError,
    PositionsMovedError,
    WriterFencedError,
)
from lakehouse.core.table_properties import TableProperties

CLAIM_ATTEMPTS = 8
# The REST protocol's multi-table commit (CommitTransactionRequest): every table change or none.
TRANSACTIONS = Endpoint(http_method=HttpMethod.POST, path="/v1/{prefix}/transactions/commit")


def _epoch(metadata: TableMetadata) -> int:
    try:
        return int(metadata.properties.get(TableProperties.WRITER_EPOCH, 0))
    except ValueError:
        return 0


def _holder(metadata: TableMetadata) -> str:
    props = metadata.properties
    writer, epoch = props.get(TableProperties.WRITER_ID, "?"), props.get(TableProperties.WRITER_EPOCH, "?")
    return f"writer {writer} (epoch {epoch}; {props.get(TableProperties.WRITER_INFO, 'no details')})"


class AssertEpochBelow(ValidatableTableRequirement):
    """The table's writer epoch is below `epoch` (so a claim with `epoch` is the newest)."""

    type: Literal["assert-lakehouse-epoch-below"] = Field(default="assert-lakehouse-epoch-below")
    epoch: int

    # pyiceberg's requirements check themselves in `validate`, an instance method shadowing pydantic's classmethod
    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]  # pyiceberg's API
        if base_metadata is None:
            raise CommitFailedException("the table is gone")
        if _epoch(base_metadata) >= self.epoch:
            raise EpochTakenError(_epoch(base_metadata), _holder(base_metadata))


class PipelineFence(ValidatableTableRequirement):
    """Checked inside the catalog's compare-and-set: the table is still claimed by `writer_id`, and
    the newest commit of `pipeline` with positions on `main` is `positions_snapshot_id` (None: none)."""

    type: Literal["assert-lakehouse-fence"] = Field(default="assert-lakehouse-fence")
    pipeline: str
    writer_id: str
    writer_epoch: int
    positions_snapshot_id: int | None = None

    # pyiceberg's requirements check themselves in `validate`, an instance method shadowing pydantic's classmethod
    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]  # pyiceberg's API
        if base_metadata is None:
            raise CommitFailedException("the table is gone")
        holder = base_metadata.properties.get(TableProperties.WRITER_ID)
        if holder != self.writer_id:
            raise WriterFencedError(
                f"pipeline {self.pipeline!r}: another ingest job took over the table ({_holder(base_metadata)}); "
                f"this job (writer {self.writer_id}, epoch {self.writer_epoch}) stops without committing. "
                f"Exactly one job per pipeline commits; stop the other one first if this one should run.")
        point = offsets.resume_point(base_metadata, self.pipeline)
        found = point.snapshot.snapshot_id if point.snapshot is not None else None
        if found != self.positions_snapshot_id:
            raise PositionsMovedError(f"pipeline {self.pipeline!r}: positions moved from snapshot "
                                      f"{self.positions_snapshot_id} to {found} since the batch was planned")


@dataclass(frozen=True)
class Writer:
    """One ingest job instance's claim on its pipeline's tables."""

    pipeline: str
    writer_id: str
    epoch: int

    def fence(self, positions_snapshot_id: int | None) -> PipelineFence:
        return PipelineFence(pipeline=self.pipeline, writer_id=self.writer_id, writer_epoch=self.epoch,
                             positions_snapshot_id=positions_snapshot_id)

    def check(self, table: Table) -> None:
        """Raise WriterFencedError now when `table` was claimed by another writer (a cheap early
        check; the commit checks again atomically)."""
        if table.metadata.properties.get(TableProperties.WRITER_ID) != self.writer_id:
            self.fence(None).validate(table.metadata)

    @classmethod
    def claim(cls, catalog: Catalog, pipeline: str, tables: list[str], home: str = "") -> Writer:
        """Claim `tables` (namespace.name, all existing) for a new writer of `pipeline`, with an epoch
        above every epoch they record. A concurrent claim with the same epoch makes this one try again
        higher, so the newest job to start wins. Raises CommitError after CLAIM_ATTEMPTS lost races."""
        writer_id = uuid.uuid4().hex
        info = (f"host {socket.gethostname()}, pid {os.getpid()}, home {home or '-'}, started "
                f"{datetime.now(UTC).isoformat(timespec='seconds')}")
        floor = 0

        def attempt(number: int) -> Writer:
            nonlocal floor
            loaded = {name: catalog.load_table(name) for name in tables}
            epoch = max([floor, *(_epoch(t.metadata) for t in loaded.values())]) + 1
            try:
                for name in sorted(tables):
                    _claim_one(catalog, name, loaded[name], epoch,
                               {TableProperties.WRITER_ID: writer_id, TableProperties.WRITER_EPOCH: str(epoch),
                                TableProperties.WRITER_INFO: info})
            except EpochTakenError as lost:  # a concurrent claim recorded this epoch first: try again above it
                floor = max(floor, lost.epoch)
                raise
            return cls(pipeline, writer_id, epoch)

        return retry.commit_conflicts(
            f"claiming the tables of pipeline {pipeline!r}", attempts=CLAIM_ATTEMPTS, error=CommitError,
            conflict=lambda exc: isinstance(exc, EpochTakenError), first_wait_s=0.05, max_wait_s=0.4,
            next_step="Other ingest jobs of the pipeline keep starting at the same time; run one job per "
                      "pipeline.").run(attempt)


def as_checked_by(catalog: Catalog, table: Table, requirements: tuple) -> tuple:
    """`requirements` of a commit on `table` as `catalog` can check them: unchanged for a catalog that
    validates them in this process inside its compare-and-set (pyiceberg's SqlCatalog, Glue, Hive); for a
    REST catalog, the lakehouse's own (`assert-lakehouse-*`) are validated now against `table`'s metadata
    (raising what they raise) and replaced by the protocol's assert-ref-snapshot-id on `main` at that
    metadata, which the server checks inside its commit."""
    if not isinstance(catalog, RestCatalog):
        return requirements
    kept = []
    for requirement in requirements:
        if requirement.type.startswith("assert-lakehouse-"):
            requirement.validate(table.metadata)
        else:
            kept.append(requirement)
    if not any(isinstance(r, AssertRefSnapshotId) and r.ref == "main" for r in kept):
        kept.append(AssertRefSnapshotId(ref="main", snapshot_id=table.metadata.current_snapshot_id))
    return tuple(kept)


def _claim_one(catalog: Catalog, name: str, table: Table, epoch: int, properties: dict[str, str]) -> None:
    def attempt(number: int) -> None:
        nonlocal table
        if number > 1:  # another commit swapped the metadata first: look again
            table = catalog.load_table(name)
        requirements = (AssertTableUUID(uuid=table.metadata.table_uuid), AssertEpochBelow(epoch=epoch))
        catalog.commit_table(table, requirements=as_checked_by(catalog, table, requirements),
                             updates=(SetPropertiesUpdate(updates=properties),))

    retry.commit_conflicts(f"the writer claim on {name}", attempts=CLAIM_ATTEMPTS, error=CommitError,
                           first_wait_s=0.0, next_step="The table kept changing; start the ingest job "
                                                       "again.").run(attempt)


@dataclass(frozen=True)
class TableChange:
    """One table's share of a commit: the requirements the catalog checks and the updates it applies."""

    table: Table
    requirements: tuple
    updates: tuple
    snapshot_id: int | None = None  # the snapshot the updates add, if any


def append_files(catalog: Catalog, table: Table, files: list, summary: dict[str, str],
                 fence: PipelineFence, deletes: list | None = None) -> int:
    """Append the data files the tasks wrote (pyiceberg DataFiles) to `main` of `table` in one snapshot
    whose summary carries `summary`, atomically, only if `main` is still where `table` was loaded and
    `fence` holds; returns the new snapshot's id. An empty `files` still commits (the positions move).
    `appended` builds the same change for `commit_together`.

    pyiceberg writes the manifests; the commit is one compare-and-set with the fence beside
    pyiceberg's own requirement on `main`, so every attempt is checked, not only the first (the
    caller reloads the table and calls again on CommitFailedException: the files stay valid). A
    failed attempt's manifests are orphans for maintenance, as are files never committed.

    pyiceberg's fast append describes every added file with the table's default partition spec, so
    the files must carry it (ValueError otherwise: the caller writes them again) and the commit
    requires it unchanged (a partition evolution landing meanwhile is a CommitFailedException).
    Manifests of older specs are carried over as they are.

    With position `deletes` (pyiceberg DataFiles of position deletes, each of its data file's spec and
    partition: lakehouse.ingest.row_deltas), the same commit is Iceberg's row delta: one `overwrite` snapshot
    that adds the files and the deletes together.
    """
    change = appended(table, files, summary, fence, deletes)
    if change.snapshot_id is None:  # never: an append adds a snapshot, and `appended` names it
        raise ValueError(f"the append to {table.name()} adds no snapshot")
    catalog.commit_table(table, requirements=as_checked_by(catalog, table, change.requirements),
                         updates=change.updates)
    return change.snapshot_id


def appended(table: Table, files: list, summary: dict[str, str], fence: PipelineFence,
             deletes: list | None = None) -> TableChange:
    """The change `append_files` commits: pyiceberg writes the new manifests and manifest list now."""
    spec_id = table.metadata.default_spec_id
    if any(f.spec_id != spec_id for f in files):
        raise ValueError(f"data files of partition specs {sorted({f.spec_id for f in files})} cannot be appended "
                         f"under the table's default spec {spec_id}")
    append = adding(table.transaction(), table, deletes or [], summary)
    for data_file in files:
        append.append_data_file(data_file)
    updates, pyicebergs = pyiceberg_internals.snapshot_change(append)
    requirements = (AssertTableUUID(uuid=table.metadata.table_uuid), *pyicebergs,
                    AssertDefaultSpecId(default_spec_id=spec_id), fence)
    return TableChange(table, requirements, updates, append.snapshot_id)


def adding(transaction: Transaction, table: Table, deletes: list, summary: dict[str, str]):
    """A pyiceberg snapshot producer on `main` of `table` in `transaction`: a fast append, or with position
    `deletes` a row delta (an `overwrite` snapshot); the data files are given to its `append_data_file`."""
    if deletes:
        return pyiceberg_internals.row_delta(transaction, table.io, deletes, summary)
    return transaction.update_snapshot(snapshot_properties=summary).fast_append()


def commit_files(table: Table, files: list, deletes: list) -> None:
    """Commit data `files` and position `deletes` to `table` in one snapshot, with pyiceberg's own requirement
    on `main` only (no fence: a table only the pipeline's own commits change, such as the tombstone ledger);
    nothing to commit for neither. CommitFailedException when `main` moved since `table` was loaded."""
    if not files and not deletes:
        return
    transaction = table.transaction()
    producer = adding(transaction, table, deletes, {})
    for data_file in files:
        producer.append_data_file(data_file)
    producer.commit()
    transaction.commit_transaction()


def commits_together(catalog: Catalog) -> TypeGuard[RestCatalog]:
    """Whether `catalog` commits several tables in one atomic request (a REST catalog whose
    configuration lists the multi-table commit endpoint; pyiceberg's SQL, Glue and Hive catalogs do not)."""
    return isinstance(catalog, RestCatalog) and TRANSACTIONS in pyiceberg_internals.rest_endpoints(catalog)


def commit_together(catalog: RestCatalog, changes: list[TableChange]) -> None:
    """Commit `changes` in one POST /v1/{prefix}/transactions/commit: the server checks every table's
    requirements (as `as_checked_by` leaves them for a REST catalog: the lakehouse's own are checked here,
    first) before it applies any change. Raises what the lakehouse's requirements raise, CommitFailedException
    on a conflict (409: no table changed), CommitStateUnknownException when the server failed mid-way (5xx:
    reload the tables to see which changes landed)."""
    request = {"table-changes": [json.loads(CommitTableRequest(
        identifier=TableIdentifier(namespace=change.table.name()[:-1], name=change.table.name()[-1]),
        requirements=as_checked_by(catalog, change.table, change.requirements),
        updates=change.updates).model_dump_json()) for change in changes]}
    session = pyiceberg_internals.rest_session(catalog)
    response = session.post(catalog.url("transactions/commit", prefixed=True), data=json.dumps(request).encode(),
                            headers=session.headers)
    try:
        response.raise_for_status()
    except HTTPError as exc:
        pyiceberg_internals.raise_rest_error(exc, {409: CommitFailedException, 500: CommitStateUnknownException,
                                                   502: CommitStateUnknownException, 504: CommitStateUnknownException})
