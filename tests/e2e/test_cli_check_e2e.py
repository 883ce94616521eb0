"""`lakehouse check` validates the specs and reaches every configured part, one line (or JSON object) per part,
like `dbt debug`: exit 0 only when every part passed, else the exit code of the first that failed.

Unreachable parts are addresses where nothing listens (free ports on 127.0.0.1): real refused connections.
The CLI runs in-process in an empty LAKEHOUSE_HOME. The last test asks the real parts the test session runs
(the broker, a REST catalog over an S3 warehouse, the schema registry) and is in the end-to-end layer.

The end-to-end half; the unit half is tests/unit/cli/test_cli_check.py.
"""

from __future__ import annotations

import json

import pytest

from lakehouse import cli
from tests.unit.cli.test_cli_check import (  # noqa: F401 - fixtures among them
    check,
)


@pytest.mark.slow
def test_every_part_of_a_running_platform_answers_ok(on_services, make_spec, monkeypatch, capfd):
    """The session's broker, the `services` home's REST catalog over an S3 warehouse and its schema registry."""
    spec = make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))

    # a generous deadline: on a loaded machine a part may be slow, which is not what this test is about
    code = cli.main(["check", "--pipeline", spec.name, "--timeout", "30s", "--json"])

    out, err = capfd.readouterr()
    parts = json.loads(out)
    assert code == 0, out + err
    assert [(p["part"], p["status"]) for p in parts] == [
        ("spec", "ok"), ("kafka", "ok"), ("object_store", "ok"), ("catalog", "ok"), ("schema_registry", "ok")], parts
    assert f"not created yet: {spec.source.topic}" in parts[1]["detail"]
    assert parts[3]["detail"].startswith("rest catalog answered: ")

    assert cli.main(["check", "--pipeline", spec.name]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert all(line.startswith("ok ") for line in lines[:-1]) and lines[-1] == "5 of 5 parts ok"
