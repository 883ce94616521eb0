"""Candidate cutover and rollback: readers move to a candidate only when it is as good, and can move back.

The slow tests run the real thing (Spark, the embedded broker, the catalog). The fast ones
replace the views and the ops timeline by `FakeLake` to check what a rollback accepts from
the timeline: only typed sources that name a known pipeline's published table, never SQL text.

The end-to-end half; the unit half is tests/unit/wap/test_cutover.py.
"""

import os
import pwd

import pytest
from e2e import pipeline, run_cli  # noqa: F401 (fixture)

from lakehouse.core import errors, events
from lakehouse.wap import cutover, publish, quality
from lakehouse_dev import produce
from tests.unit.wap.test_cutover import (  # noqa: F401 - fixtures among them
    INJECTION,
    candidate_of,
    typed,
)


def ingest(spec):
    done = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert done.returncode == 0, done.stderr[-3000:]


def audit_and_publish(spark, spec):
    result = quality.audit(spec, record_event=False)
    assert result.success, result.summary()
    publish.publish(spec, result.snapshots, spark_factory=lambda: spark, record_event=False)


def view_count(spark, spec) -> int:
    return spark.sql(f"SELECT count(*) FROM {cutover.cutover_view(spec)}").collect()[0][0]


def by_run(event: dict, run) -> dict:
    """The actor `event` records, once its origin is checked to be DAG run `run`: user, via, triggered_by."""
    actor = dict(event["details"]["actor"])
    origin = {key: actor.pop(key, None) for key in ("dag_id", "run_id", "run_type", "os_user")}
    assert origin == {"dag_id": run.dag_id, "run_id": run.run_id, "run_type": str(getattr(run.run_type, "value",
                                                                                           run.run_type)),
                      "os_user": pwd.getpwuid(os.geteuid()).pw_name}, origin
    return actor


@pytest.mark.slow
def test_readers_move_to_a_candidate_only_when_it_is_as_good_and_move_back_on_rollback(
        platform, pipeline, make_spec, spark, run_dag):
    live = pipeline()
    candidate = candidate_of(make_spec, live, partition_by=["hour(event_time)"])
    produce.produce(live, 200, seed=5)
    ingest(live)
    audit_and_publish(spark, live)
    assert view_count(spark, live) == 200

    with pytest.raises(errors.CutoverError, match="has no committed position yet"):
        cutover.cutover(spark, live, candidate, platform)

    ingest(candidate)
    audit_and_publish(spark, candidate)
    produce.produce(live, 50, seed=6)
    ingest(live)  # the candidate is now 50 records behind
    with pytest.raises(errors.CutoverError, match="candidate lag 50 records > live lag 0"):
        cutover.cutover(spark, live, candidate, platform)
    assert publish.current_view_query(spark, cutover.cutover_view(live)) == publish.view_query(live)
    refused = events.recent(live.name, kind="cutover", platform=platform)[0]
    assert refused["status"] == "failed" and "lag" in refused["message"]

    ingest(candidate)
    audit_and_publish(spark, live)
    audit_and_publish(spark, candidate)
    run = run_dag(f"{live.name}_cutover", make_spec.directory, conf={"candidate": candidate.name, "action": "cutover"})
    assert run.state == "success"
    assert publish.current_view_query(spark, cutover.cutover_view(live)) == publish.view_query(candidate)
    assert view_count(spark, live) == 250
    assert spark.sql(f"SELECT count(DISTINCT _kafka.partition, _kafka.offset) FROM {cutover.cutover_view(live)}"
                     ).collect()[0][0] == 250
    done = events.recent(live.name, kind="cutover", platform=platform)[0]
    assert done["status"] == "ok" and done["details"]["comparison"]["overlap_offsets"] == 250
    assert done["details"]["previous_query"] == publish.view_query(live)
    assert (done["details"]["previous_source"], done["details"]["source"]) == (typed(live), typed(candidate))
    # audited: who triggered the run (dag.test() runs are Airflow's `dag_test`), with what, and the outcome
    assert (done["actor"], done["message"]) == ("dag_test", f"{cutover.cutover_view(live)} now reads {candidate.name}")
    assert by_run(done, run) == {"user": "dag_test", "via": "airflow", "triggered_by": "dag_test"}
    assert done["details"]["parameters"] == {"candidate": candidate.name, "freshness_tolerance_s": None}
    assert done["metrics"] == {"overlap_offsets": 250.0}

    run = run_dag(f"{live.name}_cutover", make_spec.directory, conf={"candidate": candidate.name, "action": "rollback"})
    assert run.state == "success"
    assert publish.current_view_query(spark, cutover.cutover_view(live)) == publish.view_query(live)
    rolled_back = events.recent(live.name, kind="rollback", platform=platform)[0]
    assert rolled_back["status"] == "ok" and rolled_back["details"]["source"] == typed(live)
    assert (rolled_back["actor"], rolled_back["message"]) == ("dag_test",
                                                              f"{cutover.cutover_view(live)} reads {live.name} again")
    assert by_run(rolled_back, run) == {"user": "dag_test", "via": "airflow", "triggered_by": "dag_test"}
    assert rolled_back["details"]["parameters"] == {}  # a rollback takes none: it undoes the newest cutover
    assert (rolled_back["details"]["cutover_event"], rolled_back["details"]["rolled_back_candidate"],
            rolled_back["details"]["previous_source"]) == (done["event_id"], candidate.name, typed(candidate))
    with pytest.raises(errors.CutoverError, match="nothing to roll back"):
        cutover.rollback(spark, live, platform)


@pytest.mark.slow
def test_a_candidate_that_misses_offsets_of_the_overlap_window_is_refused(platform, pipeline, make_spec, spark):
    live = pipeline()
    candidate = candidate_of(make_spec, live)
    produce.produce(live, 120, seed=8)
    ingest(live)
    ingest(candidate)
    spark.sql(f"DELETE FROM {candidate.qualified(candidate.target.table)} WHERE _kafka.offset % 10 = 3")
    cmp = cutover.compare(spark, live, candidate, platform)
    assert not cmp.ok
    assert cmp.overlap_offsets == 120
    assert cmp.candidate_offsets_in_overlap < 120
    assert any("offsets of the overlap window" in r for r in cmp.reasons)


@pytest.mark.slow
def test_cutover_refuses_a_pipeline_that_is_not_a_candidate(platform, pipeline, make_spec, spark):
    live = pipeline()
    other = make_spec()
    with pytest.raises(errors.CutoverError, match="is not a candidate for"):
        cutover.compare(spark, live, other, platform)
    stranger = make_spec(candidate_for=live.name, publish={"view": None})
    with pytest.raises(errors.CutoverError, match="no common offsets"):
        cutover.compare(spark, live, stranger, platform)


@pytest.mark.slow
def test_rollback_refuses_a_forged_cutover_event_and_leaves_the_view_alone(platform, pipeline, make_spec, spark):
    live = pipeline()
    candidate = candidate_of(make_spec, live)
    produce.produce(live, 30, seed=9)
    ingest(live)
    audit_and_publish(spark, live)
    view = cutover.cutover_view(live)

    def forge(**details):
        events.record(events.Event(live.name, "cutover", "ok", f"{view} now reads {candidate.name}",
                                   details={"view": view, "candidate": candidate.name, **details}),
                      platform=platform, catalog=live.catalog)

    forged = [  # (cutover event details, what the refusal says)
        ({"previous_query": INJECTION, "query": publish.view_query(live)}, "has no valid 'previous_source'"),
        ({"previous_query": INJECTION, "previous_source": {"pipeline": live.name, "table": events.EVENTS_TABLE,
                                                           "branch": live.publish.branch},
          "query": publish.view_query(live), "source": typed(live)}, "not the published branch"),
    ]
    for details, refusal in forged:
        forge(**details)
        with pytest.raises(errors.CutoverError, match=refusal):
            cutover.rollback(spark, live, platform)
        assert publish.current_view_query(spark, view) == publish.view_query(live)
        assert view_count(spark, live) == 30
        refused = events.recent(live.name, kind="rollback", platform=platform, catalog=live.catalog)[0]
        assert refused["status"] == "failed" and "Nothing was changed" in refused["message"]

    # a view someone replaced by hand (here: the unaudited main branch) is not the pipeline's to cut over
    publish.replace_view(spark, view, f"SELECT * FROM {live.qualified(live.target.table)}")
    with pytest.raises(errors.CutoverError, match="not managed by this pipeline"):
        cutover.cutover(spark, live, candidate, platform)
    assert publish.current_view_query(spark, view) == f"SELECT * FROM {live.qualified(live.target.table)}"
