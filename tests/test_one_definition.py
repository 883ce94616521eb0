"""One implementation per concept: the pipeline's committed position, DAG ids, the dead-letter mapping, the
retrying of commit conflicts and outages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lakehouse
from lakehouse.core import offsets
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


# --- one definition per rule, found by scanning the sources (each scan shown to find what it forbids) ----------

REPO = Path(lakehouse.__file__).parents[2]
PACKAGE = Path(lakehouse.__file__).parent
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


SUMMARY_KEYS = {"K_PIPELINE", "K_RANGES", "K_POSITIONS"}
# ingest/job.py still assembles its two summaries by hand: the helper splitting the job routes them through
# offsets.commit_summary (issue 27); drop it from here then.
SUMMARY_PENDING = {"include/lakehouse/ingest/job.py"}


def _summary_literals(source: str) -> list[int]:
    """Lines of dict literals keyed by a pipeline commit's summary keys: a snapshot summary assembled by hand."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Dict) and any(
        (isinstance(k, ast.Attribute) and k.attr in SUMMARY_KEYS) or (isinstance(k, ast.Name) and k.id in SUMMARY_KEYS)
        for k in node.keys)]


def test_a_pipeline_commits_summary_is_assembled_by_offsets_commit_summary_only():
    roots = (PACKAGE, PROVIDER, REPO / "bench", REPO / "devstack", REPO / "dags", REPO / "spark_jobs")
    found = [f"{path}:{line}" for path, text in _sources(*roots)
             if path != "include/lakehouse/core/offsets.py" and path not in SUMMARY_PENDING
             for line in _summary_literals(text)]
    assert not found, f"snapshot summaries assembled by hand (use lakehouse.core.offsets.commit_summary): {found}"


def test_the_scan_finds_a_summary_assembled_by_hand():
    replay = ("def _summary(self, receipt):\n"
              "    return {offsets.K_PIPELINE: self.spec.name, offsets.K_KIND: receipt.kind,\n"
              "            offsets.K_RANGES: offsets.encode_ranges(receipt.ranges)}\n")
    retention = "summary = {offsets.K_KIND: KIND_RETENTION, offsets.PREFIX + 'retention-run': run_id}\n"
    assert _summary_literals(replay) == [2] and _summary_literals(retention) == []  # a maintenance commit's own


@given(ranges=st.dictionaries(st.integers(0, 50), st.tuples(st.integers(0, 10 ** 6), st.integers(0, 10 ** 6)).map(
           sorted).map(tuple), max_size=5),
       positions=st.none() | st.dictionaries(st.integers(0, 50), st.integers(0, 10 ** 9), max_size=5),
       gaps=st.dictionaries(st.integers(0, 50), st.tuples(st.integers(0, 9), st.integers(10, 19)), max_size=3))
def test_a_commit_summary_reads_back_as_the_commit_it_describes(ranges, positions, gaps):
    summary = committed_summary(ranges, positions, gaps)
    assert all(key.startswith(offsets.PREFIX) and isinstance(value, str) for key, value in summary.items())
    assert offsets.decode_ranges(summary[offsets.K_RANGES]) == ranges
    assert offsets.decode_positions(summary.get(offsets.K_POSITIONS)) == (positions or {})
    assert (offsets.K_POSITIONS in summary) == (positions is not None)
    assert offsets.decode_ranges(summary.get(offsets.K_GAPS)) == gaps and (offsets.K_GAPS in summary) == bool(gaps)
    assert (summary[offsets.K_PIPELINE], summary[offsets.K_KIND], summary[offsets.K_BATCH]) == \
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
