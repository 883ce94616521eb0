"""Candidate cutover and rollback: readers move to a candidate only when it is as good, and can move back.

The slow tests run the real thing (Spark, the embedded broker, the catalog). The fast ones
replace the views and the ops timeline by `FakeLake` to check what a rollback accepts from
the timeline: only typed sources that name a known pipeline's published table, never SQL text.

The unit half; the end-to-end half is tests/e2e/test_cutover_e2e.py.
"""

import dataclasses
import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from e2e import pipeline, run_cli  # noqa: F401 (fixture)

from lakehouse.core import config, errors, events
from lakehouse.wap import cutover, publish

INJECTION = "SELECT * FROM lake.ops.pipeline_events; DROP TABLE lake.raw.orders"


def candidate_of(make_spec, live, **overrides):
    """A candidate pipeline for `live`: same topic, its own tables, no view of its own."""
    return make_spec(source={"topic": live.source.topic}, candidate_for=live.name, publish={"view": None}, **overrides)


def typed(spec, table=None) -> dict:
    """The typed source a cutover event records for `table` (default: the main table) of `spec`."""
    return dataclasses.asdict(cutover.Source.of(spec, table))


# ---------------------------------------------------------------------------- fast: views and timeline faked

class FakeLake:
    """Readers' views and the ops timeline in memory, for cutover and rollback without Spark.

    `views` maps view names to their query; `timeline` holds (catalog, event row) as
    lakehouse.core.events would return them; `compare` and the candidate's branch always pass.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.views: dict[str, str] = {}
        self.timeline: list[tuple[str, dict]] = []
        self.clock = datetime(2030, 1, 1, tzinfo=timezone.utc)
        monkeypatch.setattr(cutover, "current_view_query", lambda spark, view: self.views.get(view))
        monkeypatch.setattr(cutover, "replace_view", lambda spark, view, query: self.views.__setitem__(view, query))
        monkeypatch.setattr(cutover.events, "record", self.record)
        monkeypatch.setattr(cutover.events, "recent", self.recent)
        monkeypatch.setattr(cutover, "compare", lambda spark, live, candidate, *args: cutover.Comparison(
            live.name, candidate.name, 0, 0, 1.0, 1.0, overlap_offsets=10))
        branch = SimpleNamespace(refs=lambda: {"published": object()})
        monkeypatch.setattr(cutover, "open_catalog",
                            lambda platform, name: SimpleNamespace(load_table=lambda table: branch))

    def record(self, *recorded: events.Event, platform=None, catalog: str = "lake") -> None:
        for event in recorded:
            self.clock += timedelta(seconds=1)
            row = dataclasses.replace(event, ts=self.clock).row()
            self.timeline.append((catalog, {**row, "details": json.loads(row["details"])}))

    def recent(self, pipeline=None, kind=None, since=None, limit=100, platform=None, catalog="lake") -> list[dict]:
        rows = [row for where, row in self.timeline if where == catalog
                and pipeline in (None, row["pipeline"]) and kind in (None, row["kind"])]
        return list(reversed(rows))[:limit]

    def events(self, kind: str) -> list[dict]:
        return [row for _, row in self.timeline if row["kind"] == kind]


@pytest.fixture
def lake(monkeypatch) -> FakeLake:
    return FakeLake(monkeypatch)


@pytest.fixture
def pipelines(make_spec):
    """(live, candidate, another candidate) on the catalog `other`; the live view reads the live pipeline."""
    live = make_spec(target={"catalog": "other"})
    first, second = (candidate_of(make_spec, live, target={"catalog": "other"}) for _ in range(2))
    return live, first, second


def test_rollback_rebuilds_the_view_from_the_specs_and_records_in_the_pipeline_catalog(lake, pipelines):
    live, first, second = pipelines
    platform, view = config.load(), cutover.cutover_view(live)
    lake.views[view] = publish.view_query(live)
    cutover.cutover(None, live, first, platform)
    cutover.cutover(None, live, second, platform)  # from one candidate straight to another
    assert lake.views[view] == publish.view_query(second)
    assert [e["details"]["previous_source"] for e in lake.events("cutover")] == [typed(live), typed(first)]
    assert cutover.rollback(None, live, platform)["source"] == typed(first)
    assert lake.views[view] == publish.view_query(first)
    assert cutover.rollback(None, live, platform)["query"] == publish.view_query(live)
    assert lake.views[view] == publish.view_query(live)
    with pytest.raises(errors.CutoverError, match="nothing to roll back"):
        cutover.rollback(None, live, platform)
    assert {where for where, _ in lake.timeline} == {"other"}  # the pipeline's catalog, not `lake`


@pytest.mark.parametrize(("forged", "refusal"), [
    pytest.param({"previous_source": None, "previous_query": INJECTION}, "has no valid 'previous_source'",
                 id="sql-text-only"),
    pytest.param({"previous_source": {"table": "raw.secrets", "branch": "published"}, "previous_query": INJECTION},
                 "not the published branch", id="foreign-table"),
    pytest.param({"previous_source": {"pipeline": "intruder"}}, "not the published branch", id="unknown-pipeline"),
    pytest.param({"previous_source": {"branch": "main"}}, "not the published branch", id="unaudited-branch"),
    pytest.param({"previous_source": {"sql": INJECTION}}, "has no valid 'previous_source'", id="extra-field"),
    pytest.param({"previous_source": INJECTION}, "has no valid 'previous_source'", id="not-an-object"),
    pytest.param({"source": {"pipeline": "intruder"}}, "names source", id="unknown-source"),
    pytest.param({"view": "other.serve.elsewhere"}, "is not one for view", id="another-view"),
])
def test_rollback_refuses_a_forged_or_malformed_cutover_event_and_changes_nothing(lake, pipelines, forged, refusal):
    live, candidate, _ = pipelines
    platform, view = config.load(), cutover.cutover_view(live)
    lake.views[view] = publish.view_query(candidate)
    details = {"view": view, "candidate": candidate.name, "previous_source": typed(live),
               "previous_query": publish.view_query(live), "source": typed(candidate),
               "query": publish.view_query(candidate)}
    for key, value in forged.items():  # None removes the key, a dict changes fields of a typed source
        if value is None:
            del details[key]
        else:
            details[key] = {**details[key], **value} if isinstance(value, dict) else value
    events.record(events.Event(live.name, "cutover", "ok", details=details), platform=platform, catalog=live.catalog)

    with pytest.raises(errors.CutoverError, match=refusal) as refused:
        cutover.rollback(None, live, platform)
    assert "Nothing was changed" in str(refused.value)
    assert lake.views == {view: publish.view_query(candidate)}
    assert [(e["status"], e["details"]["cutover_event"]) for e in lake.events("rollback")] == \
        [("failed", lake.events("cutover")[0]["event_id"])]


def test_rollback_refuses_when_the_view_changed_since_the_cutover(lake, pipelines):
    live, candidate, _ = pipelines
    platform, view = config.load(), cutover.cutover_view(live)
    lake.views[view] = publish.view_query(live)
    cutover.cutover(None, live, candidate, platform)
    lake.views[view] = publish.view_query(live, f"{live.target.table}_dlq")  # replaced since, not by a rollback
    with pytest.raises(errors.CutoverError, match="the view changed since"):
        cutover.rollback(None, live, platform)
    assert lake.views == {view: publish.view_query(live, f"{live.target.table}_dlq")}


def test_cutover_refuses_a_view_it_does_not_manage_or_a_candidate_it_cannot_verify(lake, pipelines):
    live, candidate, _ = pipelines
    platform, view = config.load(), cutover.cutover_view(live)
    with pytest.raises(errors.CutoverError, match="does not exist yet"):
        cutover.cutover(None, live, candidate, platform)
    lake.views[view] = "SELECT * FROM other.raw.secrets"
    with pytest.raises(errors.CutoverError, match="not managed by this pipeline") as refused:
        cutover.cutover(None, live, candidate, platform)
    assert publish.view_query(live) in str(refused.value)  # says how to give the view back to the pipeline
    elsewhere = dataclasses.replace(candidate, name="declared_elsewhere")
    with pytest.raises(errors.CutoverError, match="is not a candidate for"):
        cutover.cutover(None, live, elsewhere, platform)
    assert lake.views == {view: "SELECT * FROM other.raw.secrets"}
    # each refused attempt is audited: a failed cutover event naming who asked and what
    refusals = lake.events("cutover")
    assert [e["status"] for e in refusals] == ["failed"] * 3
    assert [e["details"]["parameters"]["candidate"] for e in refusals] == [candidate.name] * 2 + [elsewhere.name]
    assert {e["actor"] for e in refusals} == {events.Actor.of_process().user}
