"""`--json` has one shape per command, whatever the other options (docs/cli.md lists each): the keys a script
reads are there with and without --pipeline, --dry-run, --guard, --key. Against the session's broker and
catalog, in-process (`run_cli`)."""

from __future__ import annotations

import json

import pytest

from e2e import run_cli

pytestmark = pytest.mark.slow


def answer(spec, *args: str) -> object:
    done = run_cli(spec, *args, "--json")
    assert done.returncode in (0, 3), done.stderr[-3000:]
    return json.loads(done.stdout)


def test_each_command_answers_in_one_shape_whatever_its_options(platform, make_spec):
    spec = make_spec(partitions=1, retention={"max_retention": "30d"})

    planned = answer(spec, "topics", "--pipeline", spec.name, "--dry-run")
    created = answer(spec, "topics", "--pipeline", spec.name)
    assert set(planned) == set(created) == {"create", "mismatches", "unchanged", "created", "dry_run"}
    assert (planned["dry_run"], planned["created"], [c["topic"] for c in planned["create"]]) == \
        (True, [], [spec.source.topic])
    assert (created["dry_run"], created["created"]) == (False, [spec.source.topic])

    one = answer(spec, "status", "--pipeline", spec.name)
    every = answer(spec, "status")
    assert isinstance(one, list) and isinstance(every, list)  # a list of pipelines, one item for --pipeline
    assert [s["pipeline"] for s in one] == [s["pipeline"] for s in every] == [spec.name]
    assert set(one[0]) == set(every[0]) and {"pipeline", "tables", "kafka", "lag_records"} <= set(one[0])

    record = answer(spec, "trace", "--pipeline", spec.name, "--partition", "0", "--offset", "3")
    key = answer(spec, "trace", "--pipeline", spec.name, "--key", "ord-1", "--since", "1h")
    assert list(record) == list(key) == ["pipeline", "key", "partition", "offset", "since", "until", "scanned",
                                         "records", "seconds"]
    assert (record["partition"], record["offset"], record["key"], len(record["records"])) == (0, 3, None, 1)
    assert record["records"][0]["verdict"] == "beyond-log-end"
    assert (key["key"], key["partition"], key["records"]) == ("ord-1", None, [])

    aligned = answer(spec, "retention", "--pipeline", spec.name, "--dry-run")
    guarded = answer(spec, "retention", "--pipeline", spec.name, "--guard", "--dry-run")
    assert list(aligned) == list(guarded)
    assert (aligned["mode"], guarded["mode"]) == ("align", "guard")
    assert aligned["action"] is None and guarded["action"] == "none"  # the other mode's keys are null
    assert guarded["required_ms"] is None and aligned["required_ms"] > 0

    previewed = answer(spec, "replay", "--pipeline", spec.name, "--from-time", "1h", "--dry-run")
    assert previewed == {"pipeline": spec.name, "kind": "replay", "dry_run": True, "ranges": {}, "records": 0,
                         "tables": [spec.qualified(spec.target.table), spec.qualified(spec.dead_letter_table)],
                         "creates_table": False, "inserted_by_table": None, "dead_letters_resolved": None,
                         "dead_letters_added": None, "seconds": None}
