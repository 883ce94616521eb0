"""pyiceberg's internals the ingest path relies on, and the only module that touches them (pyiceberg 0.12.0).

- `write_data_files`: `pyiceberg.io.pyarrow._dataframe_to_data_files`, what `Table.append` runs to write
  Parquet files with the table's field ids, partition spec, target file size and column metrics, without
  committing: the Spark tasks write the files, the driver's committer commits them. pyiceberg has no public
  call for this. For the length of the call, the module's `compute_statistics_plan` is replaced by a plan
  the caller adjusts (the task writer adds bounds for the fields nested in `_kafka`), which relies on the
  writer looking that function up in its module at write time.
- `snapshot_change`: a snapshot producer's `_commit()`, the (updates, requirements) a fast append would send
  to the catalog: the committer sends them itself, with its fence beside pyiceberg's requirements, in one
  compare-and-set (or in one multi-table request).
- `row_delta`: a fast append (`_FastAppendFiles`) that also adds position delete files, in delete manifests
  (`ManifestWriterV2` with the content "deletes", which pyiceberg 0.12 writes only for data), as an
  `overwrite` snapshot: Iceberg's row delta, which pyiceberg has no call for. The summary counts the delete
  files as pyiceberg's collector counts any added file.
- `rest_session`, `rest_endpoints`, `raise_rest_error`: a REST catalog's HTTP session (`_session`: its
  authentication, headers and TLS), the endpoints its server announced (`_supported_endpoints`) and the
  mapping of an HTTP error to pyiceberg's exceptions (`pyiceberg.catalog.rest.response._handle_non_200_response`),
  for the multi-table commit (POST /v1/{prefix}/transactions/commit) pyiceberg 0.12 does not call.

tests/test_adapters.py pins the version and each internal's signature.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    import requests
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import TableMetadata

WRITTEN_AGAINST = ("pyiceberg", "0.12.0")
INTERNALS = frozenset({"_dataframe_to_data_files", "compute_statistics_plan", "_commit", "_FastAppendFiles",
                       "_added_data_files", "_manifests", "_summary", "_snapshot_id", "_compression", "_session",
                       "_supported_endpoints", "_handle_non_200_response"})

# a statistics plan (field id -> pyiceberg's StatisticsCollector) as the caller wants it, from pyiceberg's own
PlanAdjustment = Callable[[dict, "Schema", dict[str, str]], dict]
_PLAN_LOCK = threading.Lock()  # the plan is a module global of pyiceberg's writer: one write at a time adjusts it


def write_data_files(io: FileIO, metadata: TableMetadata, rows: pa.Table, write_uuid: uuid.UUID,
                     counter: itertools.count[int], adjust_plan: PlanAdjustment) -> list[DataFile]:
    """`rows` as data files of the table `metadata` describes, written by pyiceberg's writer with the statistics
    plan `adjust_plan` makes of pyiceberg's (called with the plan, the table's schema and its properties)."""
    import pyiceberg.io.pyarrow as writer

    original = writer.compute_statistics_plan

    def plan(schema, properties):
        return adjust_plan(original(schema, properties), schema, properties)

    with _PLAN_LOCK:
        writer.compute_statistics_plan = plan
        try:
            return list(writer._dataframe_to_data_files(metadata, rows, io, write_uuid=write_uuid, counter=counter))
        finally:
            writer.compute_statistics_plan = original


def snapshot_change(producer: Any) -> tuple[tuple, tuple]:
    """(updates, requirements) of a snapshot producer (`update_snapshot().fast_append()` with its files added):
    pyiceberg writes the manifests and the manifest list now; nothing is committed."""
    updates, requirements = producer._commit()
    return updates, requirements


def row_delta(transaction: Any, io: FileIO, delete_files: list[DataFile], snapshot_properties: dict[str, str]) -> Any:
    """A snapshot producer of a pyiceberg `transaction` on `main`: the data files given to its `append_data_file`
    and the position `delete_files` (each with its spec id and partition) in one `overwrite` snapshot;
    `snapshot_change` gives its change, its `commit()` applies it to the transaction."""
    from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestWriterV2
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _FastAppendFiles

    version = transaction.table_metadata.format_version
    if version != 2:
        raise ValueError(f"position deletes are written to format-version 2 tables only, not {version}")

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    class RowDelta(_FastAppendFiles):
        def _manifests(self):
            manifests = super()._manifests()
            for spec_id in sorted({f.spec_id for f in delete_files}):
                writer = DeleteManifestWriter(self.spec(spec_id), self.schema(), self.new_manifest_output(),
                                              self._snapshot_id, self._compression)
                with writer:
                    for delete_file in (f for f in delete_files if f.spec_id == spec_id):
                        writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED,
                                                           snapshot_id=self._snapshot_id, sequence_number=None,
                                                           file_sequence_number=None, data_file=delete_file))
                manifests.append(writer.to_manifest_file())
            return manifests

        def _summary(self, snapshot_properties=None):  # the delete files counted as pyiceberg counts any file
            added = self._added_data_files
            self._added_data_files = [*added, *delete_files]
            try:
                return super()._summary(snapshot_properties or {})
            finally:
                self._added_data_files = added

    return RowDelta(operation=Operation.OVERWRITE, transaction=transaction, io=io,
                    snapshot_properties=snapshot_properties)


def rest_session(catalog: RestCatalog) -> requests.Session:
    """The HTTP session `catalog` sends its requests with (authentication, headers, TLS)."""
    return catalog._session


def rest_endpoints(catalog: RestCatalog) -> Collection[Any]:
    """The endpoints `catalog`'s server announced in its configuration (empty when it announced none)."""
    return getattr(catalog, "_supported_endpoints", ())


def raise_rest_error(exc: requests.HTTPError, by_status: dict[int, type[Exception]]) -> None:
    """Raise pyiceberg's exception for the REST catalog's error answer `exc`: `by_status`'s class for its
    status code, else pyiceberg's own mapping (with the server's error message)."""
    from pyiceberg.catalog.rest.response import _handle_non_200_response

    _handle_non_200_response(exc, by_status)
