"""The embedded stack: `up` is idempotent, `status` says where everything is, `down` stops it.

The session broker (fixture `stack`) serves most tests; lifecycle tests start and
stop their own broker in a separate LAKEHOUSE_HOME on another port. Every test here but one
starts a broker or asks the session's: the module is in the end-to-end layer (marked slow).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.core import config, errors, topics
from lakehouse_dev import stack as lakestack

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped) does not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def other_home(own_home: Path, monkeypatch: pytest.MonkeyPatch, free_tcp_port: int) -> Path:
    """A second, empty LAKEHOUSE_HOME with its own port; anything started there is stopped after."""
    monkeypatch.setenv("LAKEHOUSE_BROKER_PORT", str(free_tcp_port))
    yield own_home
    lakestack.down(purge=True)


# ---------------------------------------------------------------------------- the session stack

def test_up_reports_where_everything_is(stack: dict, lakehouse_home: Path):
    port = int(os.environ["LAKEHOUSE_BROKER_PORT"])
    assert stack["home"] == str(lakehouse_home)
    assert stack["bootstrap_servers"] == f"127.0.0.1:{port}"
    assert stack["catalog_uri"] == f"sqlite:///{lakehouse_home / 'catalog.db'}"
    assert stack["warehouse"] == (lakehouse_home / "warehouse").as_uri()
    broker = stack["broker"]
    assert broker["running"] and broker["reachable"] and broker["embedded"]
    assert broker["port"] == port
    assert _alive(broker["pid"])
    assert isinstance(stack["topics"], list)


def test_up_records_the_broker_in_stack_json_for_every_process(stack: dict, lakehouse_home: Path):
    state = json.loads((lakehouse_home / "stack.json").read_text())
    assert state["pid"] == stack["broker"]["pid"]
    assert state["bootstrap_servers"] == stack["bootstrap_servers"]
    assert {"port", "started_at"} <= set(state)
    assert config.load().bootstrap_servers == stack["bootstrap_servers"]


def test_a_second_up_returns_the_running_broker(stack: dict):
    again = lakestack.up()
    assert again["started"] is False
    assert again["broker"]["pid"] == stack["broker"]["pid"]


def test_the_catalog_and_warehouse_open_right_after_up(stack: dict):
    catalog = SqlCatalog("lake", uri=stack["catalog_uri"], warehouse=stack["warehouse"])
    catalog.list_namespaces()  # the catalog tables exist: no error
    assert Path(stack["warehouse"].removeprefix("file://")).is_dir()


def test_status_lists_topics_with_their_partition_counts(platform, make_spec):
    spec = make_spec(partitions=5)
    topics.ensure_topics([spec], platform)
    listed = {t["name"]: t["partitions"] for t in lakestack.status()["topics"]}
    assert listed[spec.source.topic] == 5


# ---------------------------------------------------------------------------- topics

def test_ensure_topics_creates_the_source_topic_as_declared(platform, make_spec):
    spec = make_spec(partitions=4, retention_ms=3_600_000)
    assert topics.ensure_topics([spec], platform) == [spec.source.topic]
    assert topics.topic_partitions(platform)[spec.source.topic] == 4
    assert topics.describe_retention(spec.source.topic, platform) == 3_600_000


def test_ensure_topics_creates_nothing_the_second_time(platform, make_spec):
    spec = make_spec()
    topics.ensure_topics([spec], platform)
    assert topics.ensure_topics([spec], platform) == []


def test_ensure_topics_warns_but_keeps_a_topic_with_fewer_partitions(platform, make_spec):
    small = make_spec(partitions=2)
    topics.ensure_topics([small], platform)
    bigger = make_spec(partitions=6, source={"topic": small.source.topic})
    with pytest.warns(topics.TopicMismatchWarning, match=r"has 2 partition\(s\) but pipeline .* declares 6"):
        assert topics.ensure_topics([bigger], platform) == []
    assert topics.topic_partitions(platform)[small.source.topic] == 2


def test_ensure_topics_warns_about_a_shorter_retention_than_declared(platform, make_spec):
    short = make_spec(retention_ms=60_000)
    topics.ensure_topics([short], platform)
    longer = make_spec(retention_ms=86_400_000, source={"topic": short.source.topic})
    with pytest.warns(topics.TopicMismatchWarning, match="retention.ms=60000"):
        topics.ensure_topics([longer], platform)


def test_describe_retention_of_a_missing_topic_is_an_error(platform):
    with pytest.raises(errors.TopicError, match="does not exist"):
        topics.describe_retention("no-such-topic-here", platform)


# ---------------------------------------------------------------------------- lifecycle in a second home

def test_up_then_down_starts_and_stops_a_broker(other_home: Path):
    first = lakestack.up()
    pid = first["broker"]["pid"]
    assert first["started"] is True and first["broker"]["running"] and _alive(pid)
    assert (other_home / "logs" / "broker.log").exists()
    assert (other_home / "catalog.db").exists() and (other_home / "warehouse").is_dir()

    assert lakestack.up()["broker"]["pid"] == pid  # idempotent

    result = lakestack.down()
    assert result["stopped"] is True and result["pid"] == pid
    assert not _alive(pid)
    assert not (other_home / "stack.json").exists()
    assert (other_home / "catalog.db").exists()  # tables outlive the broker
    after = lakestack.status()
    assert after["broker"]["running"] is False and after["broker"]["reachable"] is False
    assert after["topics"] is None

    assert lakestack.down()["stopped"] is False  # idempotent


def test_down_with_purge_deletes_catalog_and_warehouse(other_home: Path):
    lakestack.up()
    purged = lakestack.down(purge=True)["purged"]
    assert str(other_home / "catalog.db") in purged and str(other_home / "warehouse") in purged
    assert not (other_home / "catalog.db").exists() and not (other_home / "warehouse").exists()


def test_up_replaces_a_broker_that_died(other_home: Path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    other_home.mkdir(parents=True, exist_ok=True)
    (other_home / "stack.json").write_text(json.dumps(
        {"pid": gone.pid, "port": int(os.environ["LAKEHOUSE_BROKER_PORT"]),
         "bootstrap_servers": f"127.0.0.1:{os.environ['LAKEHOUSE_BROKER_PORT']}"}))
    assert lakestack.status()["broker"]["running"] is False
    started = lakestack.up()
    assert started["started"] is True and started["broker"]["pid"] != gone.pid
    assert started["broker"]["running"]


def test_up_refuses_a_port_taken_by_another_process(other_home: Path, monkeypatch: pytest.MonkeyPatch):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        monkeypatch.setenv("LAKEHOUSE_BROKER_PORT", str(port))
        with pytest.raises(lakestack.StackError, match=rf"port {port} is already in use.*LAKEHOUSE_BROKER_PORT"):
            lakestack.up()
    assert not (other_home / "stack.json").exists()


def test_up_quotes_the_broker_log_when_the_broker_cannot_start(other_home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAKEHOUSE_KAFKA_JAVA_OPTIONS", "-XX:+NoSuchBrokerOption")  # the JVM refuses to start
    with pytest.raises(lakestack.StackError, match=r"(?s)exited with code 1.*NoSuchBrokerOption"):
        lakestack.up()
    assert not (other_home / "stack.json").exists()


def test_status_reports_an_external_broker(stack: dict, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAKEHOUSE_BOOTSTRAP_SERVERS", stack["bootstrap_servers"])
    external = lakestack.status()
    assert external["broker"]["embedded"] is False
    assert external["broker"]["reachable"] is True
    assert external["topics"] is not None


def test_status_reports_an_unreachable_external_broker(monkeypatch: pytest.MonkeyPatch, free_tcp_port: int):
    monkeypatch.setenv("LAKEHOUSE_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_tcp_port}")
    external = lakestack.status()
    assert external["broker"] == {**external["broker"], "embedded": False, "reachable": False, "running": False}
    assert external["topics"] is None
