"""`lakehouse trace` says where one record is, and why there.

Unit layer: the verdict for a record rows hold (in a table, a dead letter, a tombstone, duplicated,
foreign) and for one no row holds (beyond the log end, a recorded gap, not yet ingested, aged out,
no record at the offset, missing, and for upsert tables superseded or deleted), from what decides it.

The pipelines page's trace endpoints (unit layer, the plugin's app in this process with Airflow's
simple auth manager): no login is 401, a token the auth manager rejects 403, a user who may not read
the pipeline's DAGs 403, refused form values 400 with the reason; the answer from a table alone.

End-to-end (slow), on the real broker, Spark and catalog: each answer of `lakehouse trace` for
records of an ingested pipeline, by coordinates and by key over a time window, and the page's. A
recorded gap: records deleted from Kafka (DeleteRecords, what retention does to old segments) before
the pipeline read them; planning, `--accept-gap` and the commit recording the gap are the product's
own, and the trace answers `gap` from that commit, and `aged-out` for an offset Kafka no longer holds
that no row holds and no commit recorded as a gap.

The unit half; the end-to-end half is tests/e2e/test_trace_e2e.py.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import jwt
import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from e2e import page_reads, pipeline, run_cli, send, table  # noqa: F401 (pipeline: a fixture)
from fastapi.testclient import TestClient

from bench import proof
from lakehouse import cli
from lakehouse.audit.coordinates import coordinate_filter
from lakehouse.audit.intervals import Coverage
from lakehouse.audit.keys import RecordKey
from lakehouse.audit.trace import TraceRequest, trace_record, trace_request
from lakehouse.audit.verdicts import VERDICTS, Sighting, Whereabouts, held_verdict, not_held_verdict
from lakehouse.core import config, errors, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import parse_moment
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse_airflow import ui as lakehouse_ui
from tests.e2e.test_ui import field
from tests.unit.audit.test_verify import at, delete, order, orders  # noqa: F401 (orders: a fixture)

# ---------------------------------------------------------------------------- unit layer: verdicts

COMMIT = {"snapshot_id": 42, "at": "2026-11-21T10:00:00+00:00", "kind": "ingest", "batch_id": "b1",
          "table": "raw.orders", "operation": "append"}


def sighting(role: str = "data", commits=(COMMIT,), complete: bool = True, **row) -> Sighting:
    table = {"data": "raw.orders", "dead-letter": "raw.orders_dlq", "tombstones": "raw.orders__tombstones"}[role]
    return Sighting(table, role, {"_kafka": {"partition": 0, "offset": 7, "key": "k"}, **row}, list(commits), complete)


@pytest.mark.parametrize("sightings, verdict, words", [
    ([sighting()], "in-table", "is a row of raw.orders, committed by snapshot 42"),
    ([sighting("dead-letter", error_kind="bad_enum", error_detail="status 'x'")], "dead-letter",
     "a dead letter in raw.orders_dlq: bad_enum: status 'x'"),
    ([sighting("tombstones")], "tombstone", "it deleted key 'k'"),
    ([sighting(), sighting("dead-letter")], "duplicated", "held 2 times (raw.orders, raw.orders_dlq)"),
    ([sighting(commits=())], "foreign", "no commit of the pipeline covers that offset"),
    ([sighting(commits=(), complete=False)], "in-table", "is a row of raw.orders"),  # history expired: unknown
])
def test_a_held_record_is_where_its_rows_are(make_spec, sightings, verdict, words):
    found, message = held_verdict(make_spec(), 0, 7, sightings)
    assert found == verdict and words in message and found in VERDICTS


def test_a_record_no_row_holds_is_explained_by_the_log_the_positions_and_the_gaps(make_spec):
    spec = make_spec()
    where = Whereabouts(earliest=10, end=100, committed=60)
    assert not_held_verdict(spec, 0, 100, where)[0] == "beyond-log-end"
    gap = Whereabouts(earliest=10, end=100, committed=60, gap=COMMIT)
    assert not_held_verdict(spec, 0, 5, gap) == (
        "gap", f"{spec.source.topic}[0]@5 aged out of Kafka before it was ingested: the gap was recorded by "
               "snapshot 42 of raw.orders at 2026-11-21T10:00:00+00:00")
    verdict, message = not_held_verdict(spec, 0, 70, where)
    assert verdict == "not-yet-ingested" and "committed position of partition 0 is 60, 40 records behind" in message
    assert not_held_verdict(spec, 0, 5, where)[0] == "aged-out"
    assert not_held_verdict(spec, 0, 20, Whereabouts(10, 100, 60, read=True))[0] == "no-record"
    verdict, message = not_held_verdict(spec, 0, 20, Whereabouts(10, 100, 60, read=True, record={"key": "k"}))
    assert verdict == "missing" and f"--pipeline {spec.name} --offsets 0:20-21" in message


def test_an_upsert_record_no_row_holds_was_superseded_or_deleted_or_is_missing(make_spec):
    spec = make_spec(mode="upsert", table_key=["order_id"])
    record = {"key": "ord-1", "table_key": "ord-1", "timestamp_ms": 1000}
    derived = RecordKey("ord-1", ("ord-1",), False, None)

    def verdict(row=None, tombstone=None, found=derived) -> str:
        return not_held_verdict(spec, 0, 20, Whereabouts(10, 100, 60, None, True, record, row, tombstone, found))[0]

    assert verdict(row=(0, 30, 900)) == "superseded"          # a later offset of the key in the same partition
    assert verdict(row=(1, 3, 1000)) == "superseded"          # another partition, a timestamp no older
    assert verdict(row=(0, 15, 2000), tombstone=(0, 25, 0)) == "deleted"
    assert verdict(row=(1, 3, 999)) == "missing"              # the row is older: this record should be it
    assert verdict(row=(0, 30, 900), found=None) == "missing"  # a key that does not decode is a dead letter
    fanned = make_spec(mode="upsert", table_key=["order_id"],
                       fanout={"field": "status", "routes": {"paid": "raw.orders_{suffix}_paid"}})
    assert not_held_verdict(fanned, 0, 20, Whereabouts(10, 100, 60, read=True, record=record))[0] == "not-held"


def test_a_change_events_place_in_the_source_log_decides_whether_it_was_superseded(make_spec):
    spec = make_spec(fields=[{"name": "id", "type": "long", "required": True}, {"name": "email", "type": "string"}],
                     mode="cdc", table_key=["id"], partition_by=None, source={"key": {"field": None}},
                     publish={"view": None})
    record = {"key": '{"id":7}', "table_key": "7", "timestamp_ms": 5000}
    change = RecordKey('{"id":7}', (7,), False, {"op": "u", "source_ts": 4_000_000, "position": 900})

    def verdict(row) -> str:
        return not_held_verdict(spec, 1, 20, Whereabouts(10, 100, 60, None, True, record, row, None, change))[0]

    assert verdict((0, 3, 9000, 800, 4000)) == "missing"      # a later Kafka time, but earlier in the source's log
    assert verdict((0, 3, 1000, 950, 4000)) == "superseded"   # an earlier Kafka time, later in the source's log


# ---------------------------------------------------------------------------- unit layer: pruning


@pytest.fixture
def private_platform(tmp_path) -> config.PlatformConfig:
    """A platform whose catalog and warehouse are private to the test; no broker is ever contacted."""
    home = tmp_path / "home"
    home.mkdir()
    return config.PlatformConfig(home=home, bootstrap_servers="127.0.0.1:9", catalog_uri=f"sqlite:///{home}/catalog.db",
                                 warehouse=(home / "warehouse").as_uri())


def test_a_trace_reads_only_the_file_whose_coordinate_bounds_hold_the_record(make_spec, private_platform):
    """The bench's table builder writes files as ingestion does (one per partition and batch, with `_kafka`
    bounds); a trace's scan plans the one file holding the offset and answers from the table alone."""
    spec = make_spec(partitions=proof.PARTITIONS)
    catalog = open_catalog(private_platform, spec.catalog)
    built = proof.build_table(catalog, spec, rows=30_000, rows_per_commit=5_000)
    table = catalog.load_table(spec.target.table)
    assert built["commits"] == 6 and len(list(table.scan().plan_files())) == built["files"] >= 18
    planned = list(table.scan(row_filter=coordinate_filter(1, 4321, spec.source.topic)).plan_files())
    assert len(planned) == 1  # pyiceberg binds `_kafka.partition`/`_kafka.offset` and prunes on the bounds

    found = trace_record(spec, 1, 4321, private_platform)  # no broker: the table answers alone
    assert found.verdict == "in-table" and found.kafka is None
    (sighting,) = found.sightings
    assert sighting.row["order_id"] == "ord-1-4321"
    holding = [s for s in table.snapshots() if (1, 4321) in Coverage.of_ranges(offsets.decode_ranges(
        offsets.summary_properties(s).get(SnapshotSummary.RANGES)))]
    assert [c["snapshot_id"] for c in sighting.commits] == [s.snapshot_id for s in holding] and len(holding) == 1


def test_a_moment_is_an_iso_time_or_a_duration_ago():
    now = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
    assert parse_moment("2h", now) == now - timedelta(hours=2)
    assert parse_moment("2026-11-21T10:00:00Z", now) == datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
    assert parse_moment("2026-11-21T10:00:00", now) == datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)  # UTC
    assert parse_moment("2026-11-21T11:00:00+01:00", now) == datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
    for refused in ("", "yesterday", "-2h", "99999999999d", "2026-13-01"):
        with pytest.raises(ValueError, match="is neither an ISO-8601 time"):
            parse_moment(refused, now)


# ---------------------------------------------------------------------------- unit layer: the page's trace


@pytest.fixture
def auth_manager(monkeypatch):
    """Airflow's auth manager as configured (the simple one), created in this process as the API server
    creates it; forgotten after the test."""
    from airflow.api_fastapi import app as api_app

    monkeypatch.setattr(api_app._AuthManagerState, "instance", None)
    return api_app.create_auth_manager()


@pytest.fixture
def signed_in(auth_manager, monkeypatch):
    """signed_in(role) -> a client of the plugin's app whose caller `signed_in_user` (Airflow's `get_user`)
    resolves to a user of the simple auth manager with that role (None: a user without one). Whether the user may read the
    pipeline's DAGs is the auth manager's decision, as in the API server. (Tokens are checked against the
    running API server in test_ui.)"""
    def client(role: str | None = "viewer") -> TestClient:
        user = SimpleAuthManagerUser(username=f"{role or 'nobody'}-user", role=role)
        monkeypatch.setitem(lakehouse_ui.app.dependency_overrides, lakehouse_ui.signed_in_user, lambda: user)
        return TestClient(lakehouse_ui.app)

    return client


RECORD = {"partition": "0", "offset": "7"}
KEY = {"key": "ord-0-7", "since": "2h"}


@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")  # the test process's own JWT secret
def test_the_page_traces_nothing_without_a_valid_airflow_login(make_spec, auth_manager):
    spec = make_spec()
    client = TestClient(lakehouse_ui.app)
    for params in (RECORD, KEY):
        params = {"pipeline": spec.name, **params}
        anonymous = client.get("/api/trace", params=params)
        assert anonymous.status_code == 401 and anonymous.json() == {"error": "Not authenticated"}
        page = client.get("/trace", params=params)
        assert page.status_code == 401 and "Not authenticated: sign in to Airflow" in field(page.text, "error")
        assert "/auth/login?next=" in page.text  # the auth manager's login page, back to this trace after
        # a token this Airflow did not sign (another secret), by header and as the UI's cookie
        forged = jwt.encode({"sub": "admin", "role": "admin", "exp": 4102444800}, "not-the-secret-" * 5,
                            algorithm="HS512")
        refused = client.get("/api/trace", params=params, headers={"Authorization": f"Bearer {forged}"})
        assert refused.status_code == 403 and refused.json() == {"error": "Invalid JWT token"}
        client.cookies.set("_token", forged)
        assert client.get("/trace", params=params).status_code == 403
        client.cookies.clear()


def test_the_page_traces_for_users_who_may_read_the_pipelines_dags(make_spec, own_home, signed_in, monkeypatch):
    """The answer comes from the table alone (built as ingestion leaves it; no broker)."""
    spec = make_spec(partitions=proof.PARTITIONS)
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    proof.build_table(open_catalog(config.load(), spec.catalog), spec, rows=600, rows_per_commit=300)
    params = {"pipeline": spec.name, "partition": "1", "offset": "7"}

    found = signed_in("viewer").get("/api/trace", params=params)
    assert found.status_code == 200 and found.json()["verdict"] == "in-table"
    assert found.json()["sightings"][0]["row"]["order_id"] == "ord-1-7"
    page = signed_in("viewer").get("/trace", params=params)
    assert page.status_code == 200 and field(page.text, "verdict") == "in-table"
    assert field(page.text, "commit_snapshot") == str(found.json()["sightings"][0]["commits"][0]["snapshot_id"])

    for endpoint in ("/api/trace", "/trace"):
        refused = signed_in(None).get(endpoint, params=params)
        assert refused.status_code == 403
        assert f"user 'nobody-user' may not read the DAGs of pipeline '{spec.name}' ({spec.name}_ingest, " \
               f"{spec.name}_maintenance" in (refused.json()["error"] if endpoint == "/api/trace" else
                                                 refused.text.replace("&#x27;", "'"))
        assert "ord-1-7" not in refused.text


@pytest.mark.parametrize("params, words", [
    ({"pipeline": "no such!", **RECORD}, "is not a pipeline name"),
    ({"partition": "-1", "offset": "4"}, "partition must be a whole number from 0 to 2147483647, got '-1'"),
    ({"partition": "0"}, "give a partition and an offset, or a key and since (a time window)"),
    ({"partition": "0", "offset": ""}, "offset must be a whole number from 0 to 9223372036854775807, got ''"),
    ({"partition": "2147483648", "offset": "0"},
     "partition must be a whole number from 0 to 2147483647, got 2147483648"),
    ({"partition": "0", "offset": "1e3"}, "offset must be a whole number"),
    ({**RECORD, "since": "2h"}, "since and until go with a key, not with a partition and offset"),
    ({**KEY, "offset": "7"}, "a key is traced over a time window (since, until), not at a partition and offset"),
    ({"key": "", "since": "2h"}, "key must be a Kafka key of 1 to 65536 characters, got 0"),
    ({"key": "ord-0-7"}, "since is required with a key"),
    ({"key": "ord-0-7", "since": ""}, "since is required with a key"),
    ({"key": "ord-0-7", "since": "yesterday"}, "'yesterday' is neither an ISO-8601 time"),
    ({"key": "ord-0-7", "since": "2h", "until": "noon"}, "'noon' is neither an ISO-8601 time"),
    ({"key": "ord-0-7", "since": "1h", "until": "2h"}, "must be later than since"),
    ({"key": "ord-0-7", "since": "2999-01-01T00:00:00Z"}, "must be later than since"),
])
def test_the_trace_forms_refuse_values_with_the_reason(make_spec, signed_in, monkeypatch, params, words):
    spec = make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    params = {"pipeline": spec.name, **params}
    refused = signed_in().get("/api/trace", params=params)
    assert refused.status_code == 400 and words in refused.json()["error"], refused.text
    page = signed_in().get("/trace", params=params)
    assert page.status_code == 400 and words.replace("'", "&#x27;") in page.text


@pytest.mark.parametrize("params", [
    {"partition": "0"},
    {**RECORD, "since": "2026-11-21T10:00:00Z"},
    {**KEY, "offset": "7"},
    {"key": "ord-0-7"},
    {"key": "ord-0-7", "since": "2026-11-21T10:00:00Z", "until": "2026-11-21T09:00:00Z"},
    {"key": "", "since": "2h"},
])
def test_the_command_line_and_the_trace_page_refuse_a_request_in_the_same_words(make_spec, signed_in, monkeypatch,
                                                                                   capsys, params):
    """One rule (lakehouse.audit.trace.trace_request): `lakehouse trace` exits 2 with the page's 400 message."""
    spec = make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    refused = signed_in().get("/api/trace", params={"pipeline": spec.name, **params})
    assert refused.status_code == 400
    with pytest.raises(SystemExit) as info:
        cli.main(["trace", "--pipeline", spec.name, *(arg for name, value in params.items()
                                                      for arg in (f"--{name}", value))])
    assert info.value.code == 2
    assert capsys.readouterr().err.endswith(f"lakehouse trace: error: {refused.json()['error']}\n")


def test_a_trace_request_is_one_record_or_one_key_over_a_window():
    now = datetime(2026, 11, 21, 12, tzinfo=UTC)
    assert trace_request(3, 40) == TraceRequest(partition=3, offset=40)
    assert trace_request(key="k", since=now - timedelta(hours=2), now=now) == \
        TraceRequest(key="k", since=now - timedelta(hours=2))
    for asked, words in [
        ({"partition": -1, "offset": 0}, "partition must be a whole number from 0 to 2147483647, got -1"),
        ({"partition": 0, "offset": 2 ** 63}, f"offset must be a whole number from 0 to {2 ** 63 - 1}"),
        ({"key": "k", "since": now, "now": now}, "until (2026-11-21T12:00:00+00:00) must be later than since"),
        ({"key": "k", "since": now, "until": now - timedelta(seconds=1)}, "must be later than since"),
    ]:
        with pytest.raises(errors.TraceError, match=re.escape(words)):
            trace_request(**asked)


def test_a_pipeline_the_specs_do_not_declare_cannot_be_traced(make_spec, signed_in, monkeypatch):
    make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    for params in (RECORD, {**KEY, "until": "1h"}):
        unknown = signed_in().get("/api/trace", params={"pipeline": "no_such_pipeline", **params})
        assert unknown.status_code == 422 and "no pipeline named 'no_such_pipeline'" in unknown.json()["error"]


# ---------------------------------------------------------------------------- end to end


