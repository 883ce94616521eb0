"""Candidate cutover and rollback: readers move to a candidate only when it is as good, and can move back."""

import pytest

from e2e import lakehouse, pipeline  # noqa: F401 (fixture)
from lakehouse import cutover, events, produce, publish, quality

pytestmark = pytest.mark.slow


def ingest(spec):
    done = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once")
    assert done.returncode == 0, done.stderr[-3000:]


def audit_and_publish(spark, spec):
    result = quality.audit(spec, record_event=False)
    assert result.success, result.summary()
    publish.publish(spec, result.snapshots, spark_factory=lambda: spark, record_event=False)


def view_count(spark, spec) -> int:
    return spark.sql(f"SELECT count(*) FROM {cutover.view_name(spec)}").collect()[0][0]


def test_readers_move_to_a_candidate_only_when_it_is_as_good_and_move_back_on_rollback(
        platform, pipeline, make_spec, spark, run_dag):
    live = pipeline()
    candidate = make_spec(source={"topic": live.source.topic}, candidate_for=live.name,
                          partition_by=["hour(event_time)"], publish={"view": None})
    produce.produce(live, 200, seed=5)
    ingest(live)
    audit_and_publish(spark, live)
    assert view_count(spark, live) == 200

    with pytest.raises(cutover.CutoverError, match="has no committed position yet"):
        cutover.cutover(spark, live, candidate, platform)

    ingest(candidate)
    audit_and_publish(spark, candidate)
    produce.produce(live, 50, seed=6)
    ingest(live)  # the candidate is now 50 records behind
    with pytest.raises(cutover.CutoverError, match="candidate lag 50 records > live lag 0"):
        cutover.cutover(spark, live, candidate, platform)
    assert publish.current_view_query(spark, cutover.view_name(live)) == publish.view_query(live)
    refused = events.recent(live.name, kind="cutover", platform=platform)[0]
    assert refused["status"] == "failed" and "lag" in refused["message"]

    ingest(candidate)
    audit_and_publish(spark, live)
    audit_and_publish(spark, candidate)
    run = run_dag(f"{live.name}_cutover", make_spec.directory, conf={"candidate": candidate.name, "action": "cutover"})
    assert run.state == "success"
    assert publish.current_view_query(spark, cutover.view_name(live)) == publish.view_query(candidate)
    assert view_count(spark, live) == 250
    assert spark.sql(f"SELECT count(DISTINCT _kafka.partition, _kafka.offset) FROM {cutover.view_name(live)}"
                     ).collect()[0][0] == 250
    done = events.recent(live.name, kind="cutover", platform=platform)[0]
    assert done["status"] == "ok" and done["details"]["comparison"]["overlap_offsets"] == 250
    assert done["details"]["previous_query"] == publish.view_query(live)

    run = run_dag(f"{live.name}_cutover", make_spec.directory, conf={"candidate": candidate.name, "action": "rollback"})
    assert run.state == "success"
    assert publish.current_view_query(spark, cutover.view_name(live)) == publish.view_query(live)
    assert events.recent(live.name, kind="rollback", platform=platform)[0]["status"] == "ok"
    with pytest.raises(cutover.CutoverError, match="nothing to roll back"):
        cutover.rollback(spark, live, platform)


def test_a_candidate_that_misses_offsets_of_the_overlap_window_is_refused(platform, pipeline, make_spec, spark):
    live = pipeline()
    candidate = make_spec(source={"topic": live.source.topic}, candidate_for=live.name, publish={"view": None})
    produce.produce(live, 120, seed=8)
    ingest(live)
    ingest(candidate)
    spark.sql(f"DELETE FROM {candidate.qualified(candidate.target.table)} WHERE _kafka.offset % 10 = 3")
    cmp = cutover.compare(spark, live, candidate, platform)
    assert not cmp.ok
    assert cmp.overlap_offsets == 120
    assert cmp.candidate_offsets_in_overlap < 120
    assert any("offsets of the overlap window" in r for r in cmp.reasons)


def test_cutover_refuses_a_pipeline_that_is_not_a_candidate(platform, pipeline, make_spec, spark):
    live = pipeline()
    other = make_spec()
    with pytest.raises(cutover.CutoverError, match="is not a candidate for"):
        cutover.compare(spark, live, other, platform)
    stranger = make_spec(candidate_for=live.name, publish={"view": None})
    with pytest.raises(cutover.CutoverError, match="no common offsets"):
        cutover.compare(spark, live, stranger, platform)
