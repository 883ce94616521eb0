"""One implementation per concept: the pipeline's committed position, DAG ids, the dead-letter mapping, the
retrying of commit conflicts and outages, the type promotions a table takes in place, the folding of
writer-schema versions into one contract, the platform's table property and snapshot summary keys and the
Iceberg keys it names, and each library's internals behind its one adapter."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lakehouse
from lakehouse.core import offsets, schemas, table_properties
from lakehouse.core import spec as spec_module
from lakehouse.core.adapters import confluent_kafka_internals, pyiceberg_internals, pyspark_internals
from lakehouse.core.errors import OffsetGapError, SchemaTranslationError
from lakehouse.core.offsets import TableProgress, committed_positions
from lakehouse.core.spec import FieldSpec
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ingest import layout, tables, taskwriter
from lakehouse.ingest.plan import PartitionState, TopicState, plan_batch
from lakehouse_airflow import spark_provider_internals
from lakehouse_dev import re_internals

PACKAGE = Path(lakehouse.__file__).parent
REPO = PACKAGE.parents[1]


def _outside(home: str, scan) -> list[str]:
    """What `scan` finds (line numbers) in every product module but `home` (a path inside the package), as
    path:line."""
    return [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
            if path != PACKAGE / home for line in scan(path.read_text())]

def at(**positions: int) -> TableProgress:
    return TableProgress("raw.t", True, positions={int(p[1:]): o for p, o in positions.items()})


def test_the_committed_position_is_the_slowest_table_and_a_table_without_one_reads_from_the_earliest_offset():
    data, dead_letters = at(p0=50, p1=70), at(p0=40)
    assert committed_positions([data, dead_letters]) == {0: 40}  # only what every table holds
    assert committed_positions([data, dead_letters], {0: 0, 1: 5, 2: 9}) == {0: 40, 1: 5, 2: 9}
    assert committed_positions([data, dead_letters], {1: 80}) == {1: 70}  # below the earliest: a gap
    assert committed_positions([], {0: 3}) == {0: 3} and committed_positions([]) == {}


def test_a_gap_is_found_even_where_a_new_table_holds_no_position_yet(make_spec):
    state = TopicState("t", None, {0: PartitionState(0, 250, 400)})
    with pytest.raises(OffsetGapError, match=r"offsets \[100, 250\) aged out"):
        plan_batch(make_spec(), state, [at(p0=100), TableProgress("raw.new", True)], 1000)
    plan = plan_batch(make_spec(), state, [at(p0=300), TableProgress("raw.new", True)], 1000)
    assert plan.range_map() == {0: (250, 400)} and not plan.gaps  # the new table reads from the earliest offset


def test_dag_ids_come_from_the_spec_module(make_spec):
    spec = make_spec()
    assert spec_module.dag_id(spec.name, "backfill") == f"{spec.name}_backfill"
    with pytest.raises(ValueError, match="not a DAG kind"):
        spec_module.dag_id(spec.name, "nightly")
    assert spec_module.RETENTION_DAG_ID in spec_module.SHARED_DAG_IDS


def test_the_dead_letter_table_its_ddl_and_the_tasks_projection_follow_one_mapping(make_spec):
    names = [name for name, *_ in layout.DEAD_LETTER_TABLE]
    assert [c.split()[0] for c in tables.DEAD_LETTER_COLUMNS] == names
    assert sorted([n for n, _ in taskwriter.DEAD_LETTER_SOURCES] + list(taskwriter.DEAD_LETTER_PIPELINE)) \
        == sorted(names)
    schema, _ = layout.batch_schema(make_spec())
    assert all(source in schema.names for _, _, source, _ in layout.DEAD_LETTER_TABLE if source)


# what a loop's `except` names when it catches a commit conflict, or asks whether an error is one or transient
CONFLICT_OR_OUTAGE = {"CommitFailedException", "PositionsMovedError", "EpochTakenError",
                      "commit_conflict", "is_conflict", "is_conflict_in_chain", "transient_cause", "transient_reason"}


def _hand_rolled_retries(source: str) -> list[int]:
    """Lines of the `except` clauses, inside a loop, that catch a commit conflict or an outage (by name) or wait
    (`time.sleep`, `Event.wait`) before going round again: a retry loop written by hand."""
    found = set()
    for loop in ast.walk(ast.parse(source)):
        if not isinstance(loop, (ast.For, ast.While, ast.AsyncFor)):
            continue
        for handler in (n for n in ast.walk(loop) if isinstance(n, ast.ExceptHandler)):
            named = {n.id for n in ast.walk(handler) if isinstance(n, ast.Name)} \
                | {n.attr for n in ast.walk(handler) if isinstance(n, ast.Attribute)}
            waits = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                        and c.func.attr in ("sleep", "wait") for c in ast.walk(handler))
            if named & CONFLICT_OR_OUTAGE or waits:
                found.add(handler.lineno)
    return sorted(found)


def test_commit_conflicts_and_outages_are_retried_by_the_retry_policies_only():
    """lakehouse.core.retry is the one place that retries a commit another commit beat, or work an outage
    interrupted: attempts, waits, logging and the error once they run out are decided there."""
    found = _outside("core/retry.py", _hand_rolled_retries)
    assert not found, f"retry loops written by hand (use lakehouse.core.retry's policies): {found}"


def test_the_scan_finds_a_retry_loop_written_by_hand():
    conflict = ("for attempt in range(5):\n    try:\n        table.append(rows)\n        break\n"
                "    except CommitFailedException:\n        table = table.refresh()\n")
    backoff = ("while True:\n    try:\n        return run()\n    except Exception as exc:\n"
               "        if not ok(exc):\n            raise\n        time.sleep(1)\n")
    polling = ("while True:\n    try:\n        return probe()\n    except KeyError:\n        pass\n"
               "    time.sleep(0.02)\n")
    assert _hand_rolled_retries(conflict) == [5] and _hand_rolled_retries(backoff) == [4]
    assert _hand_rolled_retries(polling) == []  # waiting for something to appear is not a retry policy's job


# --- type promotions, and writer-schema versions folded into one contract ---------------------------------------

# where Iceberg's type promotions are written: the pairs (vocabulary.WIDENINGS) and the one rule (schemas.promotes)
PROMOTION_HOMES = {("core/vocabulary.py", "<module>"), ("core/schemas.py", "promotes")}
# where writer-schema versions are folded by hand, in a loop over `schemas.merge`: schemas.follow is the rule (one
# version at a time, refusing an incompatible one). The one exception: the ingest job's SchemaFollower lays the
# versions the tables were already evolved for over a contract reloaded from the folder; each was compared when it
# was accepted, and a running job keeps the folder's type rather than stopping on a reload (the test below fails
# when this entry goes stale)
MERGE_HOMES = {("ingest/schema_follower.py", "with_accepted")}


def _enclosing(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node of `tree` -> the name of the function it is written in ("<module>" outside any)."""
    owner: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            here = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            owner[child] = here
            visit(child, here)

    visit(tree, "<module>")
    return owner


def _is_precision(node: ast.AST) -> bool:
    """`x.precision` or `x.digits[0]`: a decimal's precision."""
    if isinstance(node, ast.Attribute):
        return node.attr == "precision"
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "digits" \
        and isinstance(node.slice, ast.Constant) and node.slice.value == 0


ORDERS = (ast.Gt, ast.GtE, ast.Lt, ast.LtE)


def _promotion_rules(source: str) -> list[tuple[int, str]]:
    """(line, function) of each place `source` writes a type promotion: a collection literal holding the pair
    ("int", "long") or ("float", "double"), or a comparison of two decimal precisions (a precision widening)."""
    tree = ast.parse(source)
    owner = _enclosing(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.List, ast.Tuple, ast.Dict)):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            pairs = {tuple(e.value for e in item.elts) for item in items if isinstance(item, ast.Tuple)
                     and all(isinstance(e, ast.Constant) for e in item.elts)}
            if pairs & {("int", "long"), ("float", "double")}:
                found.add((node.lineno, owner[node]))
        elif isinstance(node, ast.Compare) and any(isinstance(op, ORDERS) for op in node.ops) \
                and sum(map(_is_precision, [node.left, *node.comparators])) >= 2:
            found.add((node.lineno, owner[node]))
    return sorted(found)


def _schema_merges(source: str) -> list[tuple[int, str]]:
    """(line, function) of each loop in `source` that calls lakehouse.core.schemas' `merge` (imported as a module
    under any name, or by name, or in the module that defines it): writer-schema versions folded into a contract
    by hand."""
    tree = ast.parse(source)
    owner = _enclosing(tree)
    modules, functions = set(), set()
    if any(isinstance(node, ast.FunctionDef) and node.name == "merge" for node in tree.body):
        functions.add("merge")  # lakehouse.core.schemas itself
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "lakehouse.core":
            modules |= {a.asname or a.name for a in node.names if a.name == "schemas"}
        elif isinstance(node, ast.ImportFrom) and node.module == "lakehouse.core.schemas":
            functions |= {a.asname or a.name for a in node.names if a.name == "merge"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "lakehouse.core.schemas" and a.asname}
    found = set()
    for loop in ast.walk(tree):
        if not isinstance(loop, (ast.For, ast.While, ast.AsyncFor, ast.ListComp, ast.SetComp, ast.GeneratorExp,
                                 ast.DictComp)):
            continue
        for call in (n for n in ast.walk(loop) if isinstance(n, ast.Call)):
            f = call.func
            if isinstance(f, ast.Name) and f.id in functions or isinstance(f, ast.Attribute) and f.attr == "merge" \
                    and isinstance(f.value, ast.Name) and f.value.id in modules:
                found.add((loop.lineno, owner[loop]))
    return sorted(found)


def _scan(rule) -> set[tuple[str, str]]:
    """(module path, function) of every place the product's source writes `rule`."""
    return {(str(path.relative_to(PACKAGE)), function) for path in sorted(PACKAGE.rglob("*.py"))
            for _, function in rule(path.read_text())}


def test_the_type_promotions_a_table_takes_in_place_are_written_once():
    """vocabulary.WIDENINGS holds Iceberg's promotions between two types, schemas.promotes the one rule (a
    decimal's precision too) that comparing and merging writer schemas ask."""
    assert _scan(_promotion_rules) == PROMOTION_HOMES


def test_writer_schema_versions_are_folded_into_one_contract_by_one_rule():
    assert _scan(_schema_merges) == MERGE_HOMES  # a stale entry fails too: remove it once its copy is gone


def test_the_scans_find_a_promotion_and_a_merge_written_again():
    table = "WIDEN = {('int', 'long'), ('float', 'double')}\n"
    pairs = "def ok(a, b):\n    return (a, b) in [(\"float\", \"double\")]\n"
    decimal = "def wider(have, new):\n    return have.scale == new.scale and new.digits[0] > have.digits[0]\n"
    precision = "if new.precision >= old.precision:\n    pass\n"
    membership = "def integral(f):\n    return f.type in ('int', 'long') and f.precision is None\n"
    assert _promotion_rules(table) == [(1, "<module>")] and _promotion_rules(pairs) == [(2, "ok")]
    assert _promotion_rules(decimal) == [(2, "wider")] and _promotion_rules(precision) == [(1, "<module>")]
    assert _promotion_rules(membership) == []  # a type test is no promotion
    by_module = ("from lakehouse.core import schemas as translate\n\ndef fold(fields, versions):\n"
                 "    for v in versions:\n        fields = translate.merge(fields, v)\n    return fields\n")
    by_name = "from lakehouse.core.schemas import merge\nfields = [merge(a, b) for a, b in pairs]\n"
    other = "from lakehouse.core import sparkenv\nfor t in tables:\n    sparkenv.merge(spark, t)\n"
    once = "from lakehouse.core import schemas\n\ndef evolve(c, w):\n    return schemas.merge(c, w)\n"
    assert _schema_merges(by_module) == [(4, "fold")] and _schema_merges(by_name) == [(2, "<module>")]
    at_home = ("def merge(a, b):\n    return a\n\ndef derive_all(versions):\n    fields = None\n"
               "    for v in versions:\n        fields = v if fields is None else merge(fields, v)\n")
    assert _schema_merges(other) == [] and _schema_merges(once) == [] and _schema_merges(at_home) == [(6, "derive_all")]


def test_a_contract_follows_writer_schema_versions_oldest_first():
    v1 = (FieldSpec("id", "int", required=True), FieldSpec("amount", "decimal", precision=10, scale=2))
    v2 = (FieldSpec("id", "long", required=True), FieldSpec("amount", "decimal", precision=12, scale=2),
          FieldSpec("note", "string"))
    v3 = (FieldSpec("id", "int", required=True), FieldSpec("amount", "decimal", precision=12, scale=2))
    fields = None
    for version in (v1, v2, v3):
        fields = schemas.follow(fields, version)
    assert fields == (FieldSpec("id", "long", required=True), FieldSpec("amount", "decimal", precision=12, scale=2),
                      FieldSpec("note", "string"))
    with pytest.raises(SchemaTranslationError, match="amount"):
        schemas.follow(fields, (FieldSpec("id", "long"), FieldSpec("amount", "decimal", precision=12, scale=3)))


@pytest.mark.parametrize(("narrow", "wide", "promoted"), [
    (FieldSpec("x", "int"), FieldSpec("x", "long"), True),
    (FieldSpec("x", "float"), FieldSpec("x", "double"), True),
    (FieldSpec("x", "decimal", precision=10, scale=2), FieldSpec("x", "decimal", precision=12, scale=2), True),
    (FieldSpec("x", "long"), FieldSpec("x", "int"), False),
    (FieldSpec("x", "int"), FieldSpec("x", "double"), False),
    (FieldSpec("x", "decimal", precision=10, scale=2), FieldSpec("x", "decimal", precision=12, scale=3), False),
    (FieldSpec("x", "decimal", precision=12, scale=2), FieldSpec("x", "decimal", precision=12, scale=2), False),
    (FieldSpec("x", "string"), FieldSpec("x", "string"), False),
])
def test_a_table_promotes_a_column_only_as_iceberg_allows(narrow, wide, promoted):
    assert schemas.promotes(narrow, wide) is promoted
    diff = schemas.compare((narrow,), (wide,))
    assert (diff.widened == ["x"]) is promoted
    assert (schemas.merge((narrow,), (wide,)) == (wide,)) is (promoted or narrow == wide)


# ---------------------------------------------------------------------------- the newer record wins

COORDINATES = ("partition", "offset", "timestamp", "timestamp_ms", "position", "source_ts")
# SQL or a Column expression comparing one coordinate of two records: `s._kafka.offset > t._kafka.offset`
SQL_COMPARISON = re.compile(r"\.(offset|timestamp|timestamp_ms|position|source_ts)\b\)?\s*(>=|>)\s*[\w.\[\]\"'(]*"
                            r"\.\1\b|\.partition\b\)?\s*(<>|!=)\s*[\w.\[\]\"'(]*\.partition\b")


def _newer_rule_written_again(source: str) -> list[int]:
    """Lines that compare a coordinate of one record with the same coordinate of another (which of them is
    newer): in SQL text or Spark Columns (`s._kafka.offset > t._kafka.offset`), or in Python on attributes
    (`a.offset > b.offset`) or on tuple positions (`a[1] > b[1]`)."""
    found = {n for n, line in enumerate(source.splitlines(), 1) if SQL_COMPARISON.search(line)}

    def coordinate(node: ast.expr) -> tuple[str, object] | None:
        if isinstance(node, ast.Attribute) and node.attr in COORDINATES and isinstance(node.value, ast.Name):
            return node.value.id, node.attr
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and isinstance(node.slice, ast.Constant) \
                and (isinstance(node.slice.value, int) or node.slice.value in COORDINATES):
            return node.value.id, node.slice.value
        return None

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Gt, ast.GtE)):
            left, right = coordinate(node.left), coordinate(node.comparators[0])
            if left and right and left[1] == right[1] and left[0] != right[0]:
                found.add(node.lineno)
    return sorted(found)


def test_the_newer_record_wins_is_defined_once():
    """Which of two records of a key is newer is lakehouse.core.newer's: the MERGE's SQL, replay's tombstone
    filter and the verifier's comparison are generated from its rules, never written again."""
    found = _outside("core/newer.py", _newer_rule_written_again)
    assert not found, f"the newer-record rule written again (use lakehouse.core.newer): {found}"


def test_the_scan_finds_the_newer_record_rule_written_again():
    sql = ('NEWER = ("((s._kafka.partition = t._kafka.partition AND s._kafka.offset > t._kafka.offset) OR "\n'
           '         "(s._kafka.partition <> t._kafka.partition AND s._kafka.timestamp >= t._kafka.timestamp))")\n')
    columns = ("newer = (((s.partition == t.partition) & (s.offset > t.offset))\n"
               "         | ((s.partition != t.partition) & (s.timestamp >= t.timestamp)))\n")
    python = ("def newer(a, b):\n    if a[0] == b[0]:\n        return a[1] > b[1]\n"
              "    return a[2] >= b[2]\n")
    attributes = "def newer(a, b):\n    return a.partition == b.partition and a.offset > b.offset\n"
    assert _newer_rule_written_again(sql) == [1, 2]
    assert _newer_rule_written_again(columns) == [1, 2]
    assert _newer_rule_written_again(python) == [3, 4]
    assert _newer_rule_written_again(attributes) == [2]
    # one record's coordinate against a bound, or one table's column against a number, is not the rule
    assert _newer_rule_written_again("kept = rows.where(F.col('_kafka.offset') >= held)\nok = r.offset > 3\n"
                                     "worse = cs['lag_records'] > ls['lag_records']\n") == []


# --- the platform's keys: lakehouse.core.table_properties ----------------------------------------------------

THE_ONE_MODULE = Path(table_properties.__file__)
# where `lakehouse.*` strings can appear: the product, its Airflow side, the DAGs, the Spark jobs, the development
# stack and the benchmarks (the tests spell keys as data, e.g. a spec that tries to set one)
SCANNED = ("include/lakehouse", "plugins", "providers", "dags", "spark_jobs", "devstack", "bench")
# `lakehouse.*` strings that are not a table property nor a summary key, each with the reason
NOT_KEYS = {
    "lakehouse.commands": "an entry-point group: the commands the development stack adds to the CLI",
    "lakehouse.settings": "an entry-point group: where the development stack tells core.config about the stack",
    "lakehouse.produce": "the Avro namespace and Protobuf package of the development producer's record schemas",
    "lakehouse.rest-catalog.home": "a JVM system property naming the development REST catalog's process",
}
DOTTED = re.compile(r"lakehouse\.[A-Za-z0-9_.-]*")


def _names_code(dotted: str) -> bool:
    """Whether `dotted` names a module of the code or something in one (`lakehouse.core.fileio.DelayedOpenFileIO`,
    the modules a Spark worker imports ahead)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            found = getattr(found, name, None)
        return found is not None
    return False


def _key_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of the string literals in `source` that spell a `lakehouse.*` key (or its prefix): a whole
    literal, or an f-string's literal part, of the form `lakehouse.<name>`. Docstrings, logger names (the
    argument of getLogger) and dotted names of the code are not keys."""
    tree = ast.parse(source)
    skipped = {id(node.value) for node in ast.walk(tree)
               if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    skipped |= {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
                and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None))
                == "getLogger" for arg in node.args}
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped
                  and DOTTED.fullmatch(node.value) and node.value not in NOT_KEYS and not _names_code(node.value))


def test_the_platforms_keys_are_spelled_in_the_table_properties_module_only():
    """A table property or snapshot summary key of the platform (`lakehouse.pipeline`, `lakehouse.offsets`, ...)
    is a constant of lakehouse.core.table_properties (TableProperties, SnapshotSummary); a literal elsewhere is a
    second definition that a rename would miss."""
    found = _spelled_outside_the_one_module(_key_literals)
    assert not found, "lakehouse.* keys spelled outside lakehouse.core.table_properties:\n" + "\n".join(found)


def _spelled_outside_the_one_module(scan) -> list[str]:
    """What `scan` (source -> [(line, text)]) finds in the scanned roots outside lakehouse.core.table_properties,
    as path:line: text."""
    return _found_outside({THE_ONE_MODULE}, lambda source: [(line, repr(text)) for line, text in scan(source)])


def _found_outside(homes: set, scan) -> list[str]:
    """What `scan` (source -> [(line, what)]) finds in the Python files of the scanned roots but `homes` (which
    must be among them), as path:line: what."""
    files = sorted(f for root in SCANNED if (REPO / root).is_dir() for f in (REPO / root).rglob("*.py"))
    assert homes <= set(files) and len(files) > 100, "the source was not found"
    return [f"{path.relative_to(REPO)}:{line}: {what}" for path in files if path not in homes
            for line, what in scan(path.read_text())]


def test_the_key_scan_finds_a_key_spelled_elsewhere_and_leaves_names_of_code_alone():
    source = ('"""Records `lakehouse.offsets` in the summary."""\nimport logging\n'
              'log = logging.getLogger("lakehouse.tables")\n'
              'OWNER = "lakehouse.pipeline"\n'
              'platform = {k: v for k, v in props.items() if k.startswith("lakehouse.")}\n'
              'summary = {f"lakehouse.{name}": value}\n'
              'WORKERS = ("lakehouse.ingest.taskwriter", "lakehouse.core.fileio.DelayedOpenFileIO")\n'
              'GROUP = "lakehouse.commands"\n'
              'print(f"run it first (lakehouse.topics.ensure_topics)")\n')
    assert _key_literals(source) == [(4, "lakehouse.pipeline"), (5, "lakehouse."), (6, "lakehouse.")]


# Iceberg's own keys that the platform names (IcebergProperties: what its tables are created with, what
# maintenance reads, what a spec may not set): spelled once, there, like the platform's keys
ICEBERG_KEYS = frozenset(value for name, value in vars(table_properties.IcebergProperties).items() if name.isupper())


def _iceberg_key_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of the string literals in `source` that spell one of ICEBERG_KEYS: a whole literal, or an
    f-string's literal part, equal to the key (a key named inside a message or a docstring is prose)."""
    tree = ast.parse(source)
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ICEBERG_KEYS)


def test_icebergs_keys_that_the_platform_names_are_spelled_in_the_table_properties_module_only():
    """The Iceberg keys the platform creates its tables with (`format-version`, the metadata files kept, the
    merge-on-read modes), reads (where a table's files go, gc.enabled) or refuses from a spec are constants of
    lakehouse.core.table_properties.IcebergProperties; a literal elsewhere is a second definition of what the
    platform sets that a change of it would miss."""
    found = _spelled_outside_the_one_module(_iceberg_key_literals)
    assert not found, "Iceberg keys spelled outside lakehouse.core.table_properties:\n" + "\n".join(found)


def test_the_iceberg_key_scan_finds_a_key_spelled_elsewhere_and_leaves_prose_and_other_keys_alone():
    source = ('"""Creates its tables with `format-version` 2."""\n'
              'props = {"format-version": "2", "write.metadata.previous-versions-max": "50"}\n'
              'PLACING = (IcebergProperties.WRITE_DATA_LOCATION, "write.object-storage.path")\n'
              'why = f"set write.wap.enabled=true on {table}"\n'
              'tuning = {"write.parquet.row-group-limit": 1, "mode": "merge-on-read"}\n'
              'key = f"{scope}gc.enabled"\n')
    assert _iceberg_key_literals(source) == [(2, "format-version"), (2, "write.metadata.previous-versions-max"),
                                             (3, "write.object-storage.path"), (6, "gc.enabled")]
    # the copy the base properties were before they had one definition, planted back into tables.py
    planted = Path(tables.__file__).read_text() + \
        '\nBASE = {"format-version": "2", "write.parquet.compression-codec": "zstd"}\n'
    line = planted.count("\n")
    assert _iceberg_key_literals(planted) == [(line, "format-version"), (line, "write.parquet.compression-codec")]


def test_the_keys_are_distinct_within_each_namespace_and_under_the_platforms_prefix():
    for namespace in (table_properties.TableProperties, table_properties.SnapshotSummary):
        keys = {name: value for name, value in vars(namespace).items()
                if name.isupper() and name != "PREFIX" and not name.startswith("ROLE_")}
        assert len(set(keys.values())) == len(keys), f"{namespace.__name__}: two names for one key"
        ours = {name for name, value in keys.items() if value.startswith(table_properties.PREFIX)}
        assert ours, namespace.__name__
    summary_keys = {value for name, value in vars(table_properties.SnapshotSummary).items() if name.isupper()}
    assert {table_properties.TableProperties.STAGING, table_properties.TableProperties.TARGET_FILE_SIZE} \
        .isdisjoint(summary_keys)
    iceberg = [value for name, value in vars(table_properties.IcebergProperties).items() if name.isupper()]
    assert len(set(iceberg)) == len(iceberg), "IcebergProperties: two names for one key"
    assert not [key for key in iceberg if key.startswith(table_properties.PREFIX)]
    assert {table_properties.TableProperties.STAGING, table_properties.TableProperties.TARGET_FILE_SIZE} \
        <= set(iceberg), "TableProperties names Iceberg's keys that IcebergProperties does not hold"


# --- third-party internals: each library's behind its one adapter ---------------------------------------------

# The modules that may touch a library's internals, each with the private names it touches: the adapters of
# lakehouse.core.adapters (tests/test_adapters.py pins their versions) and the development stack's, and two
# older ones beside the code they serve.
ADAPTERS = {
    "include/lakehouse/core/adapters/pyiceberg_internals.py": pyiceberg_internals.INTERNALS,
    "include/lakehouse/core/adapters/pyspark_internals.py": pyspark_internals.INTERNALS,
    "include/lakehouse/core/adapters/confluent_kafka_internals.py": confluent_kafka_internals.INTERNALS,
    "devstack/lakehouse_dev/re_internals.py": re_internals.INTERNALS,
    "providers/lakehouse/lakehouse_airflow/spark_provider_internals.py": spark_provider_internals.INTERNALS,
    # its FileIO subclass overrides the method pyiceberg builds its S3 filesystem in (tests/test_fileio.py pins it)
    "include/lakehouse/core/fileio.py": frozenset({"_initialize_s3_fs"}),
    "include/lakehouse/core/patterns.py": frozenset({"_re2"}),  # RE2's binding: an anchored match without a copy
}
INTERNALS = frozenset().union(*ADAPTERS.values())
OURS = ("lakehouse", "lakehouse_dev", "lakehouse_airflow", "bench", "tests", "e2e", "faults")
# underscored names of a library that are its public API, each with the reason
PUBLIC_UNDERSCORED = {
    # librdkafka's local error codes, documented as confluent_kafka.KafkaError._PARTITION_EOF and so on
    "KafkaError": re.compile(r"_[A-Z][A-Z_]*"),
    # the action add_subparsers returns: the CLI walks its subcommands (the stdlib's, stable since 3.2)
    "argparse": re.compile(r"_SubParsersAction"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _internals_touched(source: str) -> list[tuple[int, str]]:
    """(line, what) where `source` touches a library's internals: an import of a private module or name (or one
    an adapter owns), an underscored attribute of an imported module or class, and any use of a name an adapter
    owns (`x._jvm`, `getattr(catalog, "_session")`) but on `self` or `cls`."""
    tree = ast.parse(source)
    imported, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] not in OURS:
            names = [a.name for a in node.names]
            if any(_private(p) or p in INTERNALS for p in node.module.split(".")) \
                    or any(_private(n) or n in INTERNALS for n in names):
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
            imported.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    continue
                if any(_private(p) or p in INTERNALS for p in alias.name.split(".")):
                    found.append((node.lineno, f"import {alias.name}"))
                imported.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (_private(node.attr) or node.attr in INTERNALS):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner in ("self", "cls"):
                continue
            public = owner in PUBLIC_UNDERSCORED and PUBLIC_UNDERSCORED[owner].fullmatch(node.attr)
            if node.attr in INTERNALS or (owner in imported and not public):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in INTERNALS:
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_third_party_internals_are_touched_by_their_adapter_only():
    """A library's private module, function or attribute is used in its adapter and nowhere else, so that an
    upgrade has one module to check (and tests/test_adapters.py fails until someone has)."""
    found = _found_outside({REPO / path for path in ADAPTERS}, _internals_touched)
    assert not found, "third-party internals touched outside their adapter:\n" + "\n".join(found)


def test_the_internals_scan_finds_a_private_touched_outside_its_adapter():
    source = ("import pyiceberg.io.pyarrow as writer\nfrom pyspark import SparkContext\n"
              "from confluent_kafka import KafkaError\nfrom re import _parser\nimport sre_parse\n"
              "files = writer._dataframe_to_data_files(metadata, rows, io)\n"
              "gateway = SparkContext._gateway\n"
              "jvm = self.spark.sparkContext._jvm\n"
              "session = getattr(catalog, '_session', None)\n"
              "eof = KafkaError._PARTITION_EOF\n"
              "self._session = parts._replace(path='/')\n"
              "writer.compute_statistics_plan = plan\n")
    assert [line for line, _ in _internals_touched(source)] == [4, 5, 6, 7, 8, 9, 12]


# --- one definition per rule, found by scanning the sources (each scan shown to find what it forbids) ----------

PROVIDER = REPO / "providers" / "lakehouse" / "lakehouse_airflow"


def _sources(*roots: Path) -> list[tuple[str, str]]:
    """(path relative to the repository, text) of every Python file under `roots`."""
    return [(str(path.relative_to(REPO)), path.read_text()) for root in roots for path in sorted(root.rglob("*.py"))]


def _strings(node: ast.AST) -> list[str]:
    """The text of every string literal under `node` (the fixed parts of f-strings too)."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _trace_request_checks(source: str) -> list[int]:
    """Lines that check a trace request by hand: a message raised (or passed to `fail`) about a trace's
    window and its record or key, or a comparison with MAX_KEY_CHARS (the length of a traced key)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        refusal = isinstance(node, ast.Raise) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                                                  and node.func.id == "fail")
        if refusal and any(("since" in s or "until" in s) and any(w in s for w in ("key", "partition", "offset"))
                           for s in _strings(node)):
            found.add(node.lineno)
        if isinstance(node, ast.Compare) and any(isinstance(n, ast.Name) and n.id == "MAX_KEY_CHARS"
                                                 or isinstance(n, ast.Attribute) and n.attr == "MAX_KEY_CHARS"
                                                 for n in ast.walk(node)):
            found.add(node.lineno)
    return sorted(found)


def test_a_trace_request_is_checked_by_audit_trace_only():
    """`lakehouse trace` and the Airflow UI's trace page both refuse a request through
    lakehouse.audit.trace.trace_request: one rule, one wording."""
    found = [f"{path}:{line}" for path, text in _sources(PACKAGE, PROVIDER)
             if path != "include/lakehouse/audit/trace.py" for line in _trace_request_checks(text)]
    assert not found, f"trace requests checked by hand (call lakehouse.audit.trace.trace_request): {found}"


def test_the_scan_finds_a_trace_request_checked_by_hand():
    cli = ('if args.key is not None and args.since is None:\n'
           '    fail("argument --key: needs --since (ISO-8601 time or a duration ago, e.g. 2h)")\n')
    page = ('if not 0 < len(key) <= MAX_KEY_CHARS:\n    raise ValueError("key too long")\n'
            'if key is None and since:\n    raise ValueError("since and until go with a key")\n')
    help_text = 'p.add_argument("--until", help="with --key: end of the window, as --since (default: now)")\n'
    assert _trace_request_checks(cli) == [2] and _trace_request_checks(page) == [1, 4]
    assert _trace_request_checks(help_text) == []  # words about the window that refuse nothing


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of `function`'s own body: those of the functions defined inside it left out."""
    found, stack = [], list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            found.append(node)
            stack.extend(ast.iter_child_nodes(node))
    return found


def _instant_parsers(source: str) -> list[int]:
    """Lines of functions that read an ISO-8601 time and make one without an offset UTC: an instant parser."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [n for n in _own_nodes(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        if any(c.func.attr == "fromisoformat" for c in calls) and any(
                c.func.attr == "replace" and any(k.arg == "tzinfo" for k in c.keywords) for c in calls):
            found.append(node.lineno)
    return found


def test_an_iso_time_a_person_wrote_is_read_by_core_durations_only():
    """core.durations.parse_instant (and parse_moment, for `2h` too) is the one reading of a time given as
    text: the CLI's, the UI's and the backfill DAG's times mean the same."""
    found = [f"{path}:{line}" for path, text in _sources(PACKAGE, PROVIDER, REPO / "dags", REPO / "devstack")
             if path != "include/lakehouse/core/durations.py" for line in _instant_parsers(text)]
    assert not found, f"ISO-8601 times parsed by hand (use lakehouse.core.durations.parse_instant): {found}"


def test_the_scan_finds_an_iso_time_parser_written_by_hand():
    backfill = ("def _time_ms(value, name):\n    parsed = datetime.fromisoformat(str(value).strip())\n"
                "    if parsed.tzinfo is None:\n        parsed = parsed.replace(tzinfo=UTC)\n"
                "    return int(parsed.timestamp() * 1000)\n")
    refusing = ("def parse_timestamp(value):\n    parsed = datetime.fromisoformat(value)\n"
                "    if parsed.tzinfo is None:\n        raise Rejected('bad_timestamp', 'no UTC offset')\n")
    nested = ("def checker(kind):\n    def timestamp(v):\n        return v.replace(tzinfo=UTC)\n"
              "    def day(v):\n        return date.fromisoformat(v)\n")
    assert _instant_parsers(backfill) == [1] and _instant_parsers(nested) == []  # two functions, each half of it
    assert _instant_parsers(refusing) == []  # a contract's timestamp without an offset is refused, not read as UTC


SUMMARY_KEYS = {"PIPELINE", "RANGES", "POSITIONS"}  # SnapshotSummary's keys a commit's summary always has


def _summary_literals(source: str) -> list[int]:
    """Lines of dict literals keyed by a pipeline commit's summary keys: a snapshot summary assembled by hand."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Dict) and any(
        (isinstance(k, ast.Attribute) and k.attr in SUMMARY_KEYS) or (isinstance(k, ast.Name) and k.id in SUMMARY_KEYS)
        for k in node.keys)]


def test_a_pipeline_commits_summary_is_assembled_by_offsets_commit_summary_only():
    roots = (PACKAGE, PROVIDER, REPO / "bench", REPO / "devstack", REPO / "dags", REPO / "spark_jobs")
    found = [f"{path}:{line}" for path, text in _sources(*roots)
             if path != "include/lakehouse/core/offsets.py"
             for line in _summary_literals(text)]
    assert not found, f"snapshot summaries assembled by hand (use lakehouse.core.offsets.commit_summary): {found}"


def test_the_scan_finds_a_summary_assembled_by_hand():
    replay = ("def _summary(self, receipt):\n"
              "    return {SnapshotSummary.PIPELINE: self.spec.name, SnapshotSummary.KIND: receipt.kind,\n"
              "            SnapshotSummary.RANGES: offsets.encode_ranges(receipt.ranges)}\n")
    retention = "summary = {SnapshotSummary.KIND: KIND_RETENTION, SnapshotSummary.RETENTION_RUN: run_id}\n"
    assert _summary_literals(replay) == [2] and _summary_literals(retention) == []  # a maintenance commit's own


@given(ranges=st.dictionaries(st.integers(0, 50), st.tuples(st.integers(0, 10 ** 6), st.integers(0, 10 ** 6)).map(
           sorted).map(tuple), max_size=5),
       positions=st.none() | st.dictionaries(st.integers(0, 50), st.integers(0, 10 ** 9), max_size=5),
       gaps=st.dictionaries(st.integers(0, 50), st.tuples(st.integers(0, 9), st.integers(10, 19)), max_size=3))
def test_a_commit_summary_reads_back_as_the_commit_it_describes(ranges, positions, gaps):
    summary = committed_summary(ranges, positions, gaps)
    assert all(key.startswith(SnapshotSummary.PREFIX) and isinstance(value, str) for key, value in summary.items())
    assert offsets.decode_ranges(summary[SnapshotSummary.RANGES]) == ranges
    assert offsets.decode_positions(summary.get(SnapshotSummary.POSITIONS)) == (positions or {})
    assert (SnapshotSummary.POSITIONS in summary) == (positions is not None)
    assert offsets.decode_ranges(summary.get(SnapshotSummary.GAPS)) == gaps and (SnapshotSummary.GAPS in summary) == bool(gaps)
    assert (summary[SnapshotSummary.PIPELINE], summary[SnapshotSummary.KIND], summary[SnapshotSummary.BATCH]) == \
        ("orders", "ingest", "b1")


def committed_summary(ranges, positions, gaps) -> dict[str, str]:
    return offsets.commit_summary("orders", "ingest", "orders", ranges, "b1", positions=positions, gaps=gaps)


# the readers' views: one function per meaning (cutover's is `cutover_view`, built on publish's view_name)
VIEW_NAMERS = {"view_name": "include/lakehouse/wap/publish.py", "fanout_view": "include/lakehouse/core/naming.py"}


def _view_namers(source: str) -> list[str]:
    """Names of the functions `source` defines that name a readers' view (VIEW_NAMERS' names)."""
    return [node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in VIEW_NAMERS]


def test_each_readers_view_name_is_defined_once():
    found = sorted((name, path) for path, text in _sources(PACKAGE, PROVIDER, REPO / "dags")
                   for name in _view_namers(text))
    assert found == sorted(VIEW_NAMERS.items()), \
        f"a readers' view named in a second place (call {VIEW_NAMERS}, or give the new function its own name): {found}"


def test_the_scan_finds_a_second_view_name():
    cutover = "def view_name(spec):\n    return spec.qualified(spec.publish.view)\n"
    assert _view_namers(cutover) == ["view_name"] and _view_namers("def cutover_view(spec):\n    pass\n") == []
