"""What the pipelines page may hand a browser (lakehouse.ops.history.public, the page's cards): aggregates,
states and who acted, never a row value, a Kafka key, a location or an exception's text; and the overview
cache, which the page reads instead of querying anything (lakehouse.ops.overview_cache).

Unit layer: overviews as `history.overview` shapes them, with hostile text planted wherever the ops
timeline, Kafka, the catalog or a spec file can put text; the cache over a folder of spec files.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timedelta, timezone

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse_airflow import ui as lakehouse_ui
from lakehouse.core import errors
from lakehouse.core.spec import SpecError, load_spec
from lakehouse.ops import history
from lakehouse.ops.overview_cache import Card, OverviewCache

NOW = datetime(2025, 3, 4, 12, 0, tzinfo=timezone.utc)
AT = (NOW - timedelta(minutes=5)).isoformat()

# Planted text: each carries a marker no aggregate, name or category can contain, and a form no harmless
# parameter value has (spaces, '#'), so finding the marker anywhere in the output is a leak.
secrets = st.builds(lambda word, n: f"SeCrEt #{n} {word}", st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30), st.integers(0, 10 ** 9))
paths = st.builds(lambda n, tail: f"/srv/PaTh{n}/{tail}", st.integers(0, 10 ** 6),
                  st.from_regex(r"[a-z0-9_.-]{0,19}[a-z0-9_]", fullmatch=True))
uris = st.builds(lambda scheme, n: f"{scheme}://bUcKeT{n}/warehouse/raw", st.sampled_from(["s3", "s3a", "file", "gs"]),
                 st.integers(0, 10 ** 6))
MARKERS = re.compile(r"SeCrEt|PaTh\d|bUcKeT\d")


def raw_overview(name: str, secret: str, path: str, uri: str, kafka_error: str | None = None) -> dict:
    """An overview as history.overview returns it, holding `secret` (row values, keys, messages, a host, an
    exception's text) and `path`/`uri` wherever the timeline, Kafka, the cost report or a layout can."""
    quality = {"at": AT, "status": "failed", "actor": None,
               "message": f"{name}: FAILED suite 'orders': amount {secret}. Data Docs: {path}/index.html",
               "metrics": {"rows": 300.0, "failed_expectations": 2.0, "unexpected_count": 7.0},
               "details": {"offending_offsets": [{"partition": 0, "offset": 4, "value": secret}], "docs": path}}
    verify = {"at": AT, "status": "failed", "actor": None, "message": f"FAILED: duplicated key {secret!r}",
              "metrics": {"offsets": 420.0, "rows": 421.0, "keys": 40.0, "duplicated": 1.0, "missing": 0.0},
              "details": {"findings": {"problems": [{"key": secret, "table": "raw.t"}]}}}
    maintenance = {"at": AT, "status": "failed", "actor": "alice",
                   "message": f"Py4JJavaError: An error occurred while calling o42: {path} not found",
                   "metrics": {}, "details": {"parameters": {"run_id": "r1"}}}
    actions = [
        {"at": AT, "kind": "replay", "status": "ok", "actor": "alice", "message": f"replayed key {secret}",
         "origin": {"via": "airflow", "dag_id": f"{name}_backfill", "run_id": "manual__2025-03-04T11:00:00+00:00",
                    "os_user": f"{secret}", "host": f"{secret}.internal"},
         "parameters": {"offsets": "0:0-10", "key": secret, "error_kind": secret, "into_table": path,
                        "dry_run": False, "filter": {"customer": secret}}},
        {"at": AT, "kind": "retention", "status": "failed", "actor": "root", "message": f"ValueError: {secret}",
         "origin": {"via": "cli", "host": f"host-{secret}", "pid": 4242, "os_user": "root"},
         "parameters": {"snapshots": {"raw.t": 17}, "from_time": "2025-03-04T10:00:00+00:00"}},
    ]
    timeline = {
        "last_batch": {"at": AT, "message": f"batch {secret}", "batch_id": secret, "records": 100.0, "rows": 95.0,
                       "dead_letters": 5.0, "seconds": 1.25, "read_s": 0.5, "commit_s": 0.25},
        "recent": {"window_s": 300.0, "batches": 3, "records": 300, "records_per_s": 1.0, "dead_letters": 5,
                   "commit_retries": 0},
        "latest": {"quality": quality, "verify": verify, "maintenance": maintenance,
                   "retry": {"at": AT, "status": "warn", "actor": None, "metrics": {"attempt": 1.0},
                             "message": f"transient failure, retry 1 in 0.5s: {uri} {secret}", "details": {}}},
        "actions": actions,
        "batches": [{"at": AT, "lag_records": 20, "freshness_s": 3.5}],
    }
    table = {"table": "raw.t", "role": "data", "exists": True, "rows": 295, "snapshots": 4,
             "current_snapshot_id": 11, "recovery_snapshot_id": 11, "positions": {"0": 150, "1": 150},
             "last_commit_at": AT, "max_event_time": AT, "lost": None}
    letters = {**table, "table": "raw.t_dlq", "role": "dead-letter", "rows": 5,
               "lost": f"table raw.t_dlq holds 5 rows, but its history under {uri} was expired"}
    kafka = ({"error": kafka_error, "error_type": "BrokerUnavailableError"} if kafka_error else
             {"topic_id": "AbCd", "partitions": [{"partition": 0, "earliest": 0, "end": 170, "committed": 150,
                                                  "lag": 20, "lag_s": 4.0}]})
    return {
        "pipeline": name, "topic": "orders", "mode": "append", "tables": [table, letters], "rows": 295,
        "dead_letters": 5, "kafka": kafka, "lag_records": None if kafka_error else 20,
        "lag_s": None if kafka_error else 4.0, "timeline": timeline,
        "layout": {"in_sync": False, "refused": [f"write.data.path moved to {uri}"],
                   "tables": [{"table": "raw.t", "in_sync": False,
                               "changes": [f"write.data.path moved to {uri}", f"property write.metadata.path: "
                                           f"'{path}' -> None"], "set_properties": {"x": {"table": secret}}}],
                   "applies": "when the ingest job next starts"},
        "last_commit_at": AT, "newest_event_time": AT, "seconds_since_commit": 300.0, "freshness_s": 300.0,
        "committed": True, "snapshot_id": 11, "positions": {"0": 150, "1": 150},
        "kafka_error": kafka_error, "quality": quality,
        "history": {"source": "events", "points": [{"at": AT, "lag_records": 20, "freshness_s": 3.5}]},
        "dags": [f"{name}_ingest", "retention_alignment"],
        "slo": {"freshness_s": 300, "lag_records": 1000, "lag_s": 60.0},
        "cost": {"pipeline": name, "topic": "orders", "retention_ms": 604800000, "retention_source": "spec",
                 "replication_factor": 1, "prices": {"currency": ""}, "priced": False,
                 "days": [{"day": NOW.date().isoformat(), "partial": True, "produced_bytes": 1000,
                           "kafka_retained_bytes": 1000, "table_bytes": 500, "table_files": 2, "put_requests": 4,
                           "get_requests": 2, "ingest_seconds": 3.0, "maintenance_seconds": 0.0, "price": None}],
                 "totals": {"produced_bytes": 1000.0},
                 "notes": [f"Kafka did not answer, so nothing produced is counted: KafkaError{{code=_TRANSPORT, "
                           f"str={secret}}}",
                           f"the ops timeline cannot be read, so compute seconds are missing: OSError: {path}",
                           f"some figure failed: ValueError: {secret}",
                           f"table storage under {uri} of days whose snapshots expired is unknown"]},
    }


def card_html(overview: dict) -> str:
    return lakehouse_ui.render_card(Card(f"{overview['pipeline']}.yaml", overview["pipeline"], ("p_ingest",), "ok",
                                   overview, None, NOW), NOW)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=secrets, path=paths, uri=uris, kafka_error=st.none() | secrets)
def test_the_overview_keeps_aggregates_and_never_carries_values_keys_locations_or_error_texts(
        secret, path, uri, kafka_error):
    found = history.public(raw_overview("orders", secret, path, uri, kafka_error))
    as_json = json.dumps(found)
    page = card_html(found)
    for shown in (as_json, page):
        assert not MARKERS.search(shown), MARKERS.search(shown).group(0)
        assert "Py4JJavaError" not in shown and "KafkaError" not in shown and "_TRANSPORT" not in shown
    # what stays: counts, states, positions, who acted and through which run
    assert found["rows"] == 295 and found["dead_letters"] == 5 and found["positions"] == {"0": 150, "1": 150}
    quality = found["quality"]
    assert (quality["status"], quality["metrics"]) == ("failed", {"failed_expectations": 2.0, "rows": 300.0,
                                                                  "unexpected_count": 7.0})
    assert quality["error"]["category"] == "the quality failed" and re.fullmatch(r"[0-9a-f]{12}", quality["error"]["id"])
    assert found["timeline"]["latest"]["verify"]["metrics"]["duplicated"] == 1.0
    assert found["timeline"]["last_batch"]["summary"] == "100 records: 95 rows, 5 dead letters in 1.2s"
    replay, retention = found["timeline"]["actions"]
    assert (replay["actor"], replay["via"], replay["dag_id"]) == ("alice", "airflow", "orders_backfill")
    assert replay["parameters"] == {"dry_run": False, "error_kind": "withheld", "filter": "withheld",
                                    "into_table": "withheld", "key": "withheld", "offsets": "0:0-10"}
    assert retention["parameters"] == {"from_time": "2025-03-04T10:00:00+00:00", "snapshots": {"raw.t": 17}}
    assert (retention["via"], retention["dag_id"], retention["error"]["category"]) == \
        ("cli", None, "the retention failed")
    assert "os_user" not in as_json and "host" not in as_json
    assert found["layout"]["refused"] == ["write.data.path moved to <location>"]
    assert found["tables"][1]["lost"] == "table raw.t_dlq holds 5 rows, but its history under <location> was expired"
    if kafka_error:
        assert found["kafka_error"]["category"] == "Kafka did not answer in time"
        assert found["kafka"] == {"error": found["kafka_error"]} and found["lag_records"] is None
    else:
        assert found["kafka"]["partitions"][0]["lag"] == 20
    notes = found["cost"]["notes"]
    assert re.fullmatch(r"Kafka did not answer, so nothing produced is counted \(error [0-9a-f]{12}\)", notes[0])
    assert re.fullmatch(r"the ops timeline cannot be read, so compute seconds are missing \(error [0-9a-f]{12}\)",
                        notes[1])
    assert re.fullmatch(r"some figure failed \(error [0-9a-f]{12}\)", notes[2])
    assert notes[3] == "table storage under <location> of days whose snapshots expired is unknown"
    # the card says the same in words
    assert "2 failed expectations" in page and "withheld" in page and "offsets=0:0-10" in page
    assert "Airflow run orders_backfill/manual__2025-03-04T11:00:00+00:00" in page and "(a command)" in page


# Values an operator may type, or a producer may put in a record, that look like data: card and phone
# numbers (digits and dashes, which an offset range's characters alone would let through), e-mail keys,
# free text, keys shaped like names, nested structures.
data_like = (st.from_regex(r"\d{4}-\d{4}-\d{4}-\d{4}|\+?\d[\d -]{6,14}\d", fullmatch=True)
             | st.emails() | secrets | st.from_regex(r"customer:[a-z0-9]{1,12}", fullmatch=True)
             | st.lists(st.integers(), max_size=3) | st.dictionaries(st.text(max_size=5), secrets, min_size=1, max_size=2))


@settings(max_examples=200, deadline=None)
# run_id is left out: an Airflow run id (or a maintenance run's uuid), which Airflow's own UI shows to the
# same users, since a card shows only to users who may read the pipeline's DAGs.
@given(name=st.sampled_from(sorted(set(history.SHOWN_PARAMETERS) - {"run_id"})), value=data_like)
def test_an_action_parameter_shows_its_value_only_in_the_form_that_parameter_takes(name, value):
    shown = history.action_of("orders", {"at": AT, "kind": "replay", "status": "ok", "actor": "alice",
                                       "origin": {"via": "cli"}, "parameters": {name: value}})["parameters"]
    assert shown == {name: history.WITHHELD}, shown
    # the forms each parameter does take still show
    taken = {"offsets": "0:100-200, 1:0-50", "start_time": "2025-03-04T10:00:00+00:00", "mode": "time",
             "error_kind": "malformed_json", "into_table": "raw.orders_fix", "candidate": "orders_v2",
             "dry_run": True, "freshness_tolerance_s": 30, "snapshots": {"raw.orders": 17}, "run_id": "r-1"}
    assert history.parameters_of(taken) == taken


def test_an_error_is_a_category_and_a_stable_id_and_the_log_has_its_text_once(caplog):
    text = "topic 'orders' does not exist on 10.1.2.3:9092 (see /etc/kafka/client.properties)"
    with caplog.at_level(logging.WARNING, logger="lakehouse.ops.history"):
        first = history.public_error("pipeline orders: Kafka", errors.TopicMissingError(text))
        again = history.public_error("pipeline orders: Kafka", text, "TopicMissingError")
        other = history.public_error("pipeline orders: Kafka", errors.TopicMissingError(text + "!"))
    assert first == again and first["category"] == "the topic does not exist"
    assert other["id"] != first["id"]
    logged = [r.getMessage() for r in caplog.records if first["id"] in r.getMessage()]
    assert len(logged) == 1 and text in logged[0]  # the full text, once per id
    # a subclass gets its nearest category; a "Type: text" string is parsed; others say their type only
    assert history.public_error("x", errors.BrokerStalledError("s"))["category"] == "Kafka did not answer in time"
    assert history.public_error("x", SpecError("/a/b.yaml", "source.topic", "bad"))["category"] == "the spec file does not load"
    assert history.public_error("x", "CatalogUnavailableError: 503 from http://cat")["category"] == \
        "the catalog did not answer"
    assert history.public_error("x", KeyError("secret"))["category"] == "an unexpected error (KeyError)"
    assert history.public_error("x", "no type here")["category"] == "an unexpected error"


@given(before=st.from_regex(r"[A-Za-z ,;:()=]{0,20}", fullmatch=True),
       location=paths | uris | st.builds(lambda n: f"~/.lakehouse{n}/x", st.integers(0, 99)),
       after=st.from_regex(r"[.,;:)]?(?: [A-Za-z ]{0,20})?", fullmatch=True))
def test_scrub_replaces_every_location_and_keeps_the_words_around_it(before, location, after):
    cleaned = history.scrub(f"{before} {location}{after}")
    assert location not in cleaned and "PaTh" not in cleaned and "bUcKeT" not in cleaned
    assert cleaned == f"{before} <location>{after}"
    # ratios, dates, offset ranges and table names are not locations
    kept = "42 records/s at 2025/03/04, offsets 0:0-10 of raw.orders_dlq (1/3)"
    assert history.scrub(kept) == kept


# ---------------------------------------------------------------------------- the cache over a folder


def write_spec(folder, name: str, topic: str | None = None) -> None:
    template = yaml.safe_load((history.config.REPO_ROOT / "include" / "pipelines" / "orders.yaml").read_text())
    template.update(name=name)
    template["source"]["topic"] = topic or name.replace("_", "-")
    template["target"]["table"] = f"raw.{name}"
    template["dead_letter"]["table"] = f"raw.{name}_dlq"
    template.setdefault("publish", {})["view"] = f"serve.{name}"
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(template, sort_keys=False))


def test_the_cache_lists_new_files_as_loading_and_broken_ones_as_a_category_without_their_path(tmp_path, caplog):
    folder = tmp_path / "pipelines"
    folder.mkdir()
    write_spec(folder, "orders_a")
    (folder / "broken.yaml").write_text("name: broken\nsource: {topic: 'bad topic!'}\n")
    cache = OverviewCache(folder, autostart=False)
    assert cache.cards() == (False, [], None)  # nothing is read on a request: not even the folder
    with caplog.at_level(logging.WARNING, logger="lakehouse.ops.history"):
        assert cache.step()  # the folder, no pipeline yet
    ready, cards, _ = cache.cards()
    assert ready and [(c.file, c.pipeline, c.state) for c in cards] == [("broken.yaml", "broken", "broken"),
                                                                        ("orders_a.yaml", "orders_a", "loading")]
    broken, loading = cards
    assert broken.dags == () and broken.error["category"] == "the spec file does not load"
    shown = json.dumps(broken.to_json(NOW))
    assert str(tmp_path) not in shown and "bad topic" not in shown
    assert any(broken.error["id"] in r.getMessage() and str(folder / "broken.yaml") in r.getMessage()
               for r in caplog.records)  # the operator finds the full text in the log
    kinds = load_spec(folder / "orders_a.yaml").dag_kinds
    assert loading.dags == tuple(f"orders_a_{kind}" for kind in kinds) and "orders_a_ingest" in loading.dags
    assert loading.to_json(NOW)["state"] == "loading" and loading.overview is None
    html = lakehouse_ui.render_page(cards, NOW)
    assert str(tmp_path) not in html
    assert re.search(r'data-pipeline="orders_a" data-state="loading">.*data-field="state"[^>]*>loading<', html, re.S)
    # a removed file's card goes at the next read of the folder, a new one comes as loading
    (folder / "broken.yaml").unlink()
    write_spec(folder, "orders_b")
    cache.rescan_s = 0.0
    cache.step()
    assert [(c.file, c.state) for c in cache.cards()[1]] == [("orders_a.yaml", "loading"), ("orders_b.yaml", "loading")]


def test_a_page_without_readable_pipelines_says_so_and_a_starting_page_reloads_soon():
    empty = lakehouse_ui.render_page([], NOW)
    assert 'data-field="no_pipelines"' in empty and 'content="30"' in empty
    starting = lakehouse_ui.render_page([], NOW, ready=False)
    assert 'data-field="starting"' in starting and 'content="3"' in starting
