"""The state of one ingest batch (lakehouse.ingest.batch_state) is a value: frozen, its mappings read-only, and
each step of the loop (planned, tables loaded again, files written) a new state that leaves the one before as
it was. The committer reads the batch's commit from it alone (lakehouse.ingest.batch_commit)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from lakehouse.core import offsets
from lakehouse.core.offsets import OffsetRange, TableProgress
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ingest.batch_commit import BatchCommitter
from lakehouse.ingest.batch_state import BatchState, Written, utc
from lakehouse.ingest.committer import Writer
from lakehouse.ingest.plan import BatchPlan


def plan_of(spec, ranges: dict[int, tuple[int, int]], gaps: dict | None = None) -> BatchPlan:
    topic = spec.source.topic
    return BatchPlan(topic, "topic-id", tuple(OffsetRange(topic, p, s, e) for p, (s, e) in sorted(ranges.items())),
                     {p: e for p, (_, e) in ranges.items()}, gaps or {})


@pytest.fixture
def planned(make_spec):
    spec = make_spec()
    progress = [TableProgress(spec.target.table, True, {0: 10, 1: 5}, snapshot_id=7),
                TableProgress(spec.dead_letter_table, True, {0: 10, 1: 5}, snapshot_id=8)]
    loaded = {spec.target.table: "data table as loaded", spec.dead_letter_table: "dead letters as loaded"}
    return BatchState.planned(spec, plan_of(spec, {0: (10, 20), 1: (5, 9)}), "b-1", loaded, progress)


def test_a_batch_state_is_frozen_and_its_mappings_are_read_only(planned):
    with pytest.raises(dataclasses.FrozenInstanceError):
        planned.batch_id = "b-2"  # type: ignore[misc]
    with pytest.raises(TypeError):
        planned.loaded["raw.other"] = "a table"  # type: ignore[index]
    with pytest.raises(TypeError):
        planned.planned_from["raw.other"] = TableProgress("raw.other", True)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        planned.written.dead_letters = 3  # type: ignore[misc]


def test_the_loops_transitions_make_new_states_and_leave_the_old_ones_as_they_were(planned):
    spec = planned.spec
    assert planned.tables == [spec.target.table, spec.dead_letter_table]  # data tables first, then dead letters
    assert planned.progress(spec.target.table).snapshot_id == 7
    assert planned.progress("raw.unknown") == TableProgress("raw.unknown", True)
    assert planned.written == Written()

    reloaded = planned.with_tables({spec.target.table: "data table evolved"})
    assert reloaded is not planned and reloaded.loaded[spec.target.table] == "data table evolved"
    assert reloaded.loaded[spec.dead_letter_table] == "dead letters as loaded"
    assert planned.loaded[spec.target.table] == "data table as loaded"

    written = reloaded.with_written(Written(rows={spec.target.table: 12}, dead_letters=2))
    assert (written.rows(spec.target.table), written.rows(spec.dead_letter_table)) == (12, 2)
    assert reloaded.rows(spec.target.table) == 0 and reloaded.written == Written()
    assert (written.plan, written.batch_id, written.planned_from) == (planned.plan, "b-1", planned.planned_from)


def test_written_numbers_are_utc_times():
    written = Written(max_event_us=1_000_000, min_kafka_us=0)
    assert written.max_event_time == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC) == utc(1_000_000)
    assert written.min_kafka_time == datetime(1970, 1, 1, tzinfo=UTC)
    assert Written().max_event_time is None and Written().min_kafka_time is None


def test_a_tables_commit_summary_holds_what_it_did_not_hold_yet_and_the_positions_after_the_batch(planned):
    """The summary the committer writes for one table, from the batch's state: the offsets past the table's own
    position (a table ahead after a crash between two commits holds fewer), the positions after the batch for
    every partition it knows, the batch, the writer and the batch's times."""
    spec = planned.spec
    state = planned.with_written(Written(max_event_us=2_000_000, min_kafka_us=1_000_000))
    committer = BatchCommitter(catalog=None, spark=None, writer=Writer(spec.name, "w-1", 3))  # type: ignore[arg-type]
    ahead = TableProgress(spec.target.table, True, {0: 14, 1: 5, 2: 40}, snapshot_id=9)
    summary = committer.summary(state, ahead)
    assert offsets.decode_ranges(summary[SnapshotSummary.RANGES]) == {0: (14, 20), 1: (5, 9)}
    assert offsets.decode_positions(summary[SnapshotSummary.POSITIONS]) == {0: 20, 1: 9, 2: 40}
    assert (summary[SnapshotSummary.BATCH], summary[SnapshotSummary.WRITER], summary[SnapshotSummary.PIPELINE]) == ("b-1", "w-1",
                                                                                                    spec.name)
    assert summary[SnapshotSummary.MAX_EVENT_TIME] == utc(2_000_000).isoformat()
    assert summary[SnapshotSummary.MIN_KAFKA_TIME] == utc(1_000_000).isoformat()
    assert SnapshotSummary.GAPS not in summary
    gapped = dataclasses.replace(state, plan=plan_of(spec, {0: (10, 20)}, gaps={0: (3, 10)}))
    assert offsets.decode_ranges(committer.summary(gapped, ahead)[SnapshotSummary.GAPS]) == {0: (3, 10)}
