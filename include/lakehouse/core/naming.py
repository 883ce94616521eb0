"""The names a spec gives and the platform derives: pipelines, tables and views, topics, contract
fields, the DAGs of each pipeline and the readers' view of each fan-out table.

Every pattern is matched with fullmatch: `$` would also match before a final newline, and
"raw.orders\\n" would then name a table that Spark and pyiceberg resolve differently.
"""

from __future__ import annotations

import re
from typing import Any

_NAME = r"[a-z_][a-z0-9_]{0,127}"  # at most 128 characters: DAG ids, lock files and catalog columns stay short
IDENTIFIER = re.compile(_NAME)
TABLE_NAME = re.compile(rf"{_NAME}\.{_NAME}")  # namespace.table, as every table and view in a spec
# TABLE_NAME for JSON Schema (Airflow's forms check with Python's re.search, browsers with JavaScript): a `$`
# anchor would let "raw.x\n" through in Python, `(?![\s\S])` (nothing follows) means the end of the text in both.
TABLE_NAME_FORM_PATTERN = rf"^{TABLE_NAME.pattern}(?![\s\S])"
TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # Kafka's own rule
# Contract field names: Avro's and Protobuf's rule (letters, digits, underscores), so that a contract
# derived from a writer schema keeps its names; two names of one record may not differ only in case
# (Spark resolves columns case-insensitively).
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

# The platform's own table in every catalog (= lakehouse.core.events.EVENTS_TABLE, which is not imported
# here: events pulls in pyiceberg; a test keeps the two equal).
OPS_TIMELINE_TABLE = "ops.pipeline_events"

# The Airflow DAGs: per pipeline one of each kind, `dag_id(pipeline, kind)`, and the ones every pipeline shares.
DAG_KINDS = ("ingest", "maintenance", "publish", "backfill", "cutover", "verify")
RETENTION_DAG_ID = "retention_alignment"
RETENTION_GUARD_DAG_ID = "retention_guard"
SHARED_DAG_IDS = (RETENTION_DAG_ID, RETENTION_GUARD_DAG_ID)


def dag_id(pipeline: str, kind: str) -> str:
    """The id of pipeline `pipeline`'s DAG of `kind` (one of DAG_KINDS; ValueError otherwise)."""
    if kind not in DAG_KINDS:
        raise ValueError(f"{kind!r} is not a DAG kind: {', '.join(DAG_KINDS)}")
    return f"{pipeline}_{kind}"


def is_table_name(text: Any) -> bool:
    """Whether `text` is a table or view name as specs write them: `namespace.name`, lower case, in full."""
    return isinstance(text, str) and TABLE_NAME.fullmatch(text) is not None


def fanout_view(view: str, table: str) -> str:
    """The readers' view of fan-out table `table` (namespace.name) of a pipeline whose default table is
    read through `view`: the view's namespace with the table's own name."""
    return f"{view.split('.')[0]}.{table.split('.')[1]}"
