"""One implementation per concept: the pipeline's committed position, DAG ids, the dead-letter mapping, the
retrying of commit conflicts and outages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lakehouse
from lakehouse.core import spec as spec_module
from lakehouse.core.errors import OffsetGapError
from lakehouse.core.offsets import TableProgress, committed_positions
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
