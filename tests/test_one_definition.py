"""One implementation per concept: the pipeline's committed position, DAG ids, the dead-letter mapping, the
retrying of commit conflicts and outages, the type promotions a table takes in place and the folding of
writer-schema versions into one contract."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import lakehouse
from lakehouse.core import schemas
from lakehouse.core import spec as spec_module
from lakehouse.core.errors import OffsetGapError, SchemaTranslationError
from lakehouse.core.offsets import TableProgress, committed_positions
from lakehouse.core.spec import FieldSpec
from lakehouse.ingest import reader, tables, taskwriter
from lakehouse.ingest.plan import PartitionState, TopicState, plan_batch


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
    names = [name for name, *_ in reader.DEAD_LETTER_TABLE]
    assert [c.split()[0] for c in tables.DEAD_LETTER_COLUMNS] == names
    assert sorted([n for n, _ in taskwriter.DEAD_LETTER_SOURCES] + list(taskwriter.DEAD_LETTER_PIPELINE)) \
        == sorted(names)
    schema, _ = reader.batch_schema(make_spec())
    assert all(source in schema.names for _, _, source, _ in reader.DEAD_LETTER_TABLE if source)


# what a loop's `except` names when it catches a commit conflict, or asks whether an error is one or transient
CONFLICT_OR_OUTAGE = {"CommitFailedException", "MainMovedError", "PositionsMovedError", "EpochTakenError",
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
    package = Path(lakehouse.__file__).parent
    found = [f"{path.relative_to(package)}:{line}" for path in sorted(package.rglob("*.py"))
             if path != package / "core" / "retry.py" for line in _hand_rolled_retries(path.read_text())]
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

PACKAGE = Path(lakehouse.__file__).parent
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
    package = Path(lakehouse.__file__).parent
    found = [f"{path.relative_to(package)}:{line}" for path in sorted(package.rglob("*.py"))
             if path != package / "core" / "newer.py" for line in _newer_rule_written_again(path.read_text())]
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
