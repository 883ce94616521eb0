"""OpenLineage events for what the pipelines read and write, when lineage is configured; nothing otherwise.

Configuration is OpenLineage's own, from the environment, the same that Airflow's OpenLineage
provider reads: `OPENLINEAGE_URL` (HTTP, with `OPENLINEAGE_API_KEY`), `OPENLINEAGE__TRANSPORT__TYPE`
with its `OPENLINEAGE__TRANSPORT__*` settings (console, file, http, kafka, ...; or the whole transport
as JSON in `OPENLINEAGE__TRANSPORT`), or `OPENLINEAGE_CONFIG` (a YAML file);
`OPENLINEAGE_DISABLED=true` turns it off and `OPENLINEAGE_NAMESPACE` names the jobs' namespace
(default `default`). With none of them set no client is made and nothing is emitted: lineage costs
nothing unless configured (the openlineage-python client alone would print every event to the console).

Datasets are named by the OpenLineage naming conventions:

- a Kafka topic: namespace `kafka://{host}:{port}` of the first bootstrap server, name the topic;
  its `schema` facet is the pipeline's contract;
- an Iceberg table or view: by where it lives, as OpenLineage's Spark integration names Iceberg tables
  (a local warehouse: namespace `file` and the path; S3: `s3://{bucket}` and the key), with a `symlinks`
  facet naming it in its catalog (namespace the warehouse, name `namespace.table`), `catalog` (framework
  iceberg, type jdbc, name, warehouse; never credentials), `datasetType` (TABLE or VIEW), `storage`
  (iceberg, parquet), `schema` (the Iceberg schema, nested fields included) and, when known,
  `version` (the snapshot id). A table written at a branch (publication moves the readers' branch)
  is the same dataset, its `symlinks` naming the branch too: `namespace.table.branch_<branch>`
  (the identifier Spark reads it by), type BRANCH.

`ingest_batch` is the continuous ingest job's event, one COMPLETE run per committed batch (job
`lakehouse-ingest-<pipeline>`, the Spark application's name; run id the batch id): input the topic
with the records read (`inputStatistics`), outputs the data and dead-letter tables with the rows,
files and bytes the batch's commits added (`outputStatistics`) and the snapshot each commit made.
Emitting never fails the batch: any error is logged and the batch goes on. Airflow tasks emit through
Airflow's OpenLineage provider instead; their operators build their datasets with `table_dataset`.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

from lakehouse.core import config
from lakehouse.core.spec import PipelineSpec

log = logging.getLogger("lakehouse.lineage")

PRODUCER = "https://github.com/lakehouse-platform/lakehouse"  # who made the events (OpenLineage `producer`)
DEFAULT_NAMESPACE = "default"
_CONFIGURING = ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG")  # besides OPENLINEAGE__TRANSPORT*
KAFKA_DEFAULT_PORT = "9092"


class TableCommitLike(Protocol):
    table: str
    rows: int
    snapshot_id: int | None
    files: int
    bytes: int


class BatchLike(Protocol):
    """What `ingest_batch` reads of an ingest batch's receipt (lakehouse.ingest.job.BatchReceipt)."""

    batch_id: str
    records: int

    @property
    def commits(self) -> Sequence[TableCommitLike]: ...  # read only: a list of any TableCommitLike will do


def _settings() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("OPENLINEAGE")))


def configured() -> bool:
    """Whether OpenLineage is configured in this environment (and not disabled)."""
    if os.environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    return any(os.environ.get(name) for name in _CONFIGURING) or any(
        k.startswith("OPENLINEAGE__TRANSPORT") and v for k, v in os.environ.items())


_lock = threading.Lock()
_client: tuple[tuple, Any] | None = None  # (the OPENLINEAGE* settings it was made from, the client or None)


def client():
    """The process's OpenLineage client, made when first needed and again when the OPENLINEAGE*
    settings change; None when lineage is not configured."""
    global _client
    settings = _settings()
    with _lock:
        if _client is None or _client[0] != settings:
            made = None
            if configured():
                from openlineage.client import OpenLineageClient

                made = OpenLineageClient()
            _client = (settings, made)
        return _client[1]


def namespace() -> str:
    """The namespace of the jobs this process emits (OPENLINEAGE_NAMESPACE)."""
    return os.environ.get("OPENLINEAGE_NAMESPACE", "").strip() or DEFAULT_NAMESPACE


def _without_credentials(uri: str) -> str:
    """`uri` without user info, query or fragment: a location, never a secret."""
    parts = urlsplit(uri)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment="").geturl()


def location_name(location: str) -> tuple[str, str]:
    """(namespace, name) of a dataset stored at `location`, by OpenLineage's naming: `file` and the path
    for a local one, `s3://{bucket}` (`gs://{bucket}`) and the key for object stores, `{scheme}://{host}`
    and the path otherwise."""
    parts = urlsplit(_without_credentials(location))
    if parts.scheme in ("", "file"):
        return "file", parts.path
    if parts.scheme in ("s3", "s3a", "s3n", "gs"):
        return f"{'gs' if parts.scheme == 'gs' else 's3'}://{parts.netloc}", parts.path.lstrip("/")
    return f"{parts.scheme}://{parts.netloc}", parts.path


def kafka_namespace(bootstrap_servers: str) -> str:
    """`kafka://{host}:{port}` of the first bootstrap server (a listener name such as SASL_SSL:// dropped)."""
    first = bootstrap_servers.split(",")[0].strip().rpartition("://")[2]
    host, _, port = first.rpartition(":") if ":" in first else (first, "", KAFKA_DEFAULT_PORT)
    return f"kafka://{host}:{port or KAFKA_DEFAULT_PORT}"


def _schema_fields(struct) -> list:
    """OpenLineage schema fields of a pyiceberg struct (a Schema or a StructType), nested structs included."""
    from openlineage.client.generated.schema_dataset import SchemaDatasetFacetFields
    from pyiceberg.types import StructType

    return [SchemaDatasetFacetFields(
        name=f.name, type="struct" if isinstance(f.field_type, StructType) else str(f.field_type),
        description=f.doc or None,
        fields=_schema_fields(f.field_type) if isinstance(f.field_type, StructType) else [])
        for f in struct.fields]


def kafka_dataset(spec: PipelineSpec, platform: config.PlatformConfig, records: int | None = None):
    """The pipeline's topic as an OpenLineage input dataset: its contract as `schema`, and the records
    read as `inputStatistics` when given."""
    from openlineage.client.event_v2 import InputDataset
    from openlineage.client.generated.base import InputDatasetFacet
    from openlineage.client.generated.input_statistics_input_dataset import InputStatisticsInputDatasetFacet
    from openlineage.client.generated.schema_dataset import SchemaDatasetFacet, SchemaDatasetFacetFields

    schema = SchemaDatasetFacet(fields=[SchemaDatasetFacetFields(name=f.name, type=f.type, description=f.doc or None)
                                        for f in spec.contract.fields])
    stats: dict[str, InputDatasetFacet] = {}
    if records is not None:
        stats["inputStatistics"] = InputStatisticsInputDatasetFacet(rowCount=records)
    return InputDataset(namespace=kafka_namespace(platform.bootstrap_servers), name=spec.source.topic,
                        facets={"schema": schema}, inputFacets=stats)


def table_dataset(spec: PipelineSpec, platform: config.PlatformConfig, name: str, table=None, *, output: bool = False,
                  view: bool = False, schema=None, version: int | None = None, rows: int | None = None,
                  files: int | None = None, size: int | None = None, branch: str | None = None):
    """Iceberg table (or, with `view`, view) `name` (namespace.name) of `spec`'s catalog as an OpenLineage
    input dataset, or with `output` an output dataset whose `outputStatistics` are `rows`, `files`, `size`.

    `table` is the pyiceberg Table (its location, and its schema unless `schema` is given); without it
    the default location in the warehouse is used (where the JDBC catalog puts a view's metadata).
    `version` is the snapshot id, when known; `branch` the table's branch it is read or written at
    (a second `symlinks` identifier, `name.branch_<branch>`, type BRANCH).
    """
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.generated.catalog_dataset import CatalogDatasetFacet
    from openlineage.client.generated.dataset_type_dataset import DatasetTypeDatasetFacet
    from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
    from openlineage.client.generated.output_statistics_output_dataset import OutputStatisticsOutputDatasetFacet
    from openlineage.client.generated.schema_dataset import SchemaDatasetFacet
    from openlineage.client.generated.storage_dataset import StorageDatasetFacet
    from openlineage.client.generated.symlinks_dataset import Identifier, SymlinksDatasetFacet

    warehouse = _without_credentials(platform.warehouse).rstrip("/")
    location = table.location() if table is not None else f"{warehouse}/{name.replace('.', '/')}"
    dataset_namespace, dataset_name = location_name(location)
    kind = "VIEW" if view else "TABLE"
    identifiers = [Identifier(namespace=warehouse, name=name, type=kind)]
    if branch is not None:
        identifiers.append(Identifier(namespace=warehouse, name=f"{name}.branch_{branch}", type="BRANCH"))
    facets: dict[str, Any] = {
        "symlinks": SymlinksDatasetFacet(identifiers=identifiers),
        "catalog": CatalogDatasetFacet(framework="iceberg", type="jdbc", name=spec.catalog, warehouseUri=warehouse),
        "datasetType": DatasetTypeDatasetFacet(datasetType=kind),
        "storage": StorageDatasetFacet(storageLayer="iceberg", fileFormat="parquet"),
    }
    schema = schema if schema is not None else table.schema() if table is not None else None
    if schema is not None:
        facets["schema"] = SchemaDatasetFacet(fields=_schema_fields(schema))
    if version is not None:
        facets["version"] = DatasetVersionDatasetFacet(datasetVersion=str(version))
    if not output:
        return InputDataset(namespace=dataset_namespace, name=dataset_name, facets=facets)
    stats = OutputStatisticsOutputDatasetFacet(rowCount=rows, fileCount=files, size=size)
    return OutputDataset(namespace=dataset_namespace, name=dataset_name, facets=facets,
                         outputFacets={"outputStatistics": stats})


def emit(event) -> None:
    """Send `event` with the process's client; nothing when lineage is not configured."""
    made = client()
    if made is not None:
        made.emit(event)


def ingest_batch(spec: PipelineSpec, platform: config.PlatformConfig, receipt: BatchLike,
                 tables: dict[str, Any] | None = None) -> None:
    """Emit the COMPLETE run event of a committed ingest batch (see the module's doc); `tables` are the
    pyiceberg Tables the batch committed to, by name (their locations and schemas). Never raises: a
    lineage backend that is down or misconfigured is logged and the batch goes on."""
    try:
        if client() is None:
            return
        from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
        from openlineage.client.generated.job_type_job import JobTypeJobFacet

        tables = tables or {}
        outputs = [table_dataset(spec, platform, c.table, tables.get(c.table), output=True, version=c.snapshot_id,
                                 rows=c.rows, files=c.files, size=c.bytes) for c in receipt.commits]
        emit(RunEvent(
            eventType=RunState.COMPLETE, eventTime=datetime.now(UTC).isoformat(),
            run=Run(runId=str(uuid.UUID(hex=receipt.batch_id))),
            job=Job(namespace=namespace(), name=f"lakehouse-ingest-{spec.name}",
                    facets={"jobType": JobTypeJobFacet(processingType="STREAMING", integration="LAKEHOUSE",
                                                       jobType="BATCH")}),
            inputs=[kafka_dataset(spec, platform, receipt.records)], outputs=outputs, producer=PRODUCER))
    except Exception as exc:  # noqa: BLE001 - lineage is for people and tools; the batch is committed
        log.warning("could not emit the OpenLineage event of batch %s of %s: %s: %s",
                    getattr(receipt, "batch_id", "?"), spec.name, type(exc).__name__, exc)

