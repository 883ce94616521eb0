"""With nothing answering where Kafka should be, a command fails within seconds with one line naming the
unreachable part and the setting to check, exits non-zero and creates nothing; librdkafka's own lines
appear only with --verbose. `stack status` and `airflow status` exit 1 when nothing runs.

Kafka "down" is a bootstrap address where nothing listens (a free port): a real refused connection, no
broker needed. The CLI runs in-process (`lakehouse.cli.main`) in an empty LAKEHOUSE_HOME; librdkafka
writes to file descriptor 2 directly, so stderr is captured at the descriptor (capfd).

The unit half; the end-to-end half is tests/e2e/test_unreachable_e2e.py.
"""

from __future__ import annotations

import logging
import re
import time

import pytest

from lakehouse import cli
from lakehouse.core import topics
from lakehouse.core.errors import EXIT_FAILURE, EXIT_SOURCE

LIBRDKAFKA_MARKS = ("rdkafka", "%3|", "%4|", "%6|", "Connection refused")


@pytest.fixture
def broker_down(own_home, make_spec, monkeypatch, free_tcp_port):
    """An empty home, one pipeline spec, and LAKEHOUSE_BOOTSTRAP_SERVERS at a port nothing listens on."""
    spec = make_spec(partitions=2)
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    address = f"127.0.0.1:{free_tcp_port}"
    monkeypatch.setenv("LAKEHOUSE_BOOTSTRAP_SERVERS", address)
    return {"home": own_home, "spec": spec, "address": address}


def terminal(err: str, address: str) -> list[str]:
    """The lines of `err` the command wrote: librdkafka lines of another test's client, left running in this
    process against a broker since stopped, also reach descriptor 2 and name that broker's address, not
    `address`."""
    return [line for line in err.splitlines() if not (re.match(r"%\d+\|", line) and address not in line)]


def run(argv: list[str]) -> tuple[int, float]:
    started = time.monotonic()
    code = cli.main(argv)
    return code, time.monotonic() - started


COMMANDS = [
    ["status"],
    ["status", "--pipeline", "{name}", "--json"],
    ["topics"],
    ["topics", "--dry-run"],
    ["retention", "--pipeline", "{name}"],
    ["retention", "--pipeline", "{name}", "--guard", "--dry-run"],
    ["replay", "--pipeline", "{name}", "--offsets", "0:0-10", "--dry-run"],
    ["replay", "--pipeline", "{name}", "--from-time", "2026-01-01T00:00:00Z"],
    ["trace", "--pipeline", "{name}", "--partition", "0", "--offset", "3"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(a for a in argv if a != "{name}"))
def test_a_command_with_kafka_down_fails_fast_with_one_line_naming_kafka_and_the_setting(
        broker_down, argv, capfd, caplog, monkeypatch):
    monkeypatch.setattr(topics, "BROKER_CHECK_S", 1.0)  # the default's few seconds, shortened for nine commands
    argv = [a.replace("{name}", broker_down["spec"].name) for a in argv]

    code, seconds = run(argv)

    out, err = capfd.readouterr()
    assert code == EXIT_SOURCE, (out, err)
    assert seconds < 5
    lines = terminal(err, broker_down["address"])
    assert lines == [f"error: Kafka is unreachable: nothing answered at {broker_down['address']} (PLAINTEXT) "
                     f"within 1s; check LAKEHOUSE_BOOTSTRAP_SERVERS and that the broker runs"], err
    assert out == ""
    assert not [r for r in caplog.records if r.name == "lakehouse.kafka"]  # nothing of librdkafka's, even logged
    assert list(broker_down["home"].iterdir()) == []  # no catalog database, no warehouse, no state


def test_the_default_check_ends_within_seconds_and_with_the_embedded_broker_says_how_to_start_it(
        own_home, monkeypatch, free_tcp_port, capfd):
    monkeypatch.delenv("LAKEHOUSE_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("LAKEHOUSE_PIPELINES_DIR", raising=False)  # the shipped specs
    monkeypatch.setenv("LAKEHOUSE_BROKER_PORT", str(free_tcp_port))  # the embedded broker's port: not running

    code, seconds = run(["status"])

    err = capfd.readouterr().err
    assert code == EXIT_SOURCE
    assert seconds < topics.BROKER_CHECK_S + 4
    [line] = terminal(err, f"127.0.0.1:{free_tcp_port}")
    assert f"nothing answered at 127.0.0.1:{free_tcp_port}" in line
    assert "LAKEHOUSE_BOOTSTRAP_SERVERS (unset: the embedded broker of LAKEHOUSE_HOME" in line
    assert "`lakehouse stack up`" in line
    assert list(own_home.iterdir()) == []


def test_verbose_shows_librdkafka_lines(broker_down, capfd, caplog, monkeypatch):
    monkeypatch.setattr(topics, "BROKER_CHECK_S", 1.0)
    caplog.set_level(logging.DEBUG, logger="lakehouse.kafka")

    code, _ = run(["--verbose", "status", "--pipeline", broker_down["spec"].name])

    assert code == EXIT_SOURCE
    shown = [r.getMessage() for r in caplog.records if r.name == "lakehouse.kafka"]
    assert any(broker_down["address"] in line and "refused" in line.lower() for line in shown), shown
    assert "error: Kafka is unreachable" in capfd.readouterr().err


def test_without_verbose_librdkafka_never_reaches_stderr(broker_down, capfd, monkeypatch):
    """The check's client logs through the `lakehouse.kafka` logger, which the CLI silences: no `%3|...`
    line is written to the terminal by librdkafka itself."""
    monkeypatch.setattr(topics, "BROKER_CHECK_S", 2.0)

    run(["topics", "--pipeline", broker_down["spec"].name])

    err = capfd.readouterr().err
    assert not [line for line in terminal(err, broker_down["address"])
                if any(mark in line for mark in LIBRDKAFKA_MARKS)], err


def test_stack_status_exits_1_when_the_broker_does_not_run(own_home, monkeypatch, free_tcp_port, capfd):
    monkeypatch.delenv("LAKEHOUSE_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("LAKEHOUSE_BROKER_PORT", str(free_tcp_port))

    assert cli.main(["stack", "status"]) == EXIT_FAILURE
    assert f"kafka      127.0.0.1:{free_tcp_port} (embedded, NOT running)" in capfd.readouterr().out
    assert cli.main(["stack", "status", "--json"]) == EXIT_FAILURE


def test_stack_status_of_an_external_broker_nobody_answers_at_exits_1(broker_down, capfd):
    assert cli.main(["stack", "status"]) == EXIT_FAILURE
    assert f"kafka      {broker_down['address']} (external, NOT running)" in capfd.readouterr().out


def test_airflow_status_exits_1_when_no_component_runs(own_home, capfd):
    assert cli.main(["airflow", "status"]) == EXIT_FAILURE
    out = capfd.readouterr().out
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert any(line.startswith(component) and "NOT running" in line for line in out.splitlines()), out


