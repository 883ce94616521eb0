"""`lakehouse check` validates the specs and reaches every configured part, one line (or JSON object) per part,
like `dbt debug`: exit 0 only when every part passed, else the exit code of the first that failed.

Unreachable parts are addresses where nothing listens (free ports on 127.0.0.1): real refused connections.
The CLI runs in-process in an empty LAKEHOUSE_HOME. The last test asks the real parts the test session runs
(the broker, a REST catalog over an S3 warehouse, the schema registry) and is in the end-to-end layer.

The unit half; the end-to-end half is tests/e2e/test_cli_check_e2e.py.
"""

from __future__ import annotations

import json
import time

import pytest

from lakehouse import cli
from lakehouse.core.errors import EXIT_CONFIG, EXIT_SOURCE


@pytest.fixture
def nothing_answers(own_home, make_spec, monkeypatch, free_tcp_port) -> dict:
    """One valid spec, and Kafka, the catalog database, the object store of an s3:// warehouse and the schema
    registry all configured at an address where nothing listens; credentials that must never be shown."""
    spec = make_spec()
    address = f"127.0.0.1:{free_tcp_port}"
    settings = {
        "LAKEHOUSE_PIPELINES_DIR": str(make_spec.directory),
        "LAKEHOUSE_BOOTSTRAP_SERVERS": address,
        "LAKEHOUSE_CATALOG_URI": f"postgresql+psycopg2://lakehouse:catalog-secret@{address}/lake",
        "LAKEHOUSE_WAREHOUSE": "s3://lakehouse-check/warehouse",
        "LAKEHOUSE_S3_ENDPOINT": f"http://{address}",
        "LAKEHOUSE_S3_REGION": "us-east-1",  # no bucket-region lookup at AWS
        "LAKEHOUSE_SCHEMA_REGISTRY_URL": f"http://registry-user:registry-secret@{address}",
        # the AWS SDK takes these, and never asks an instance metadata service for credentials
        "AWS_ACCESS_KEY_ID": "check-key", "AWS_SECRET_ACCESS_KEY": "aws-secret", "AWS_EC2_METADATA_DISABLED": "true",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return {"home": own_home, "spec": spec, "address": address, "specs": make_spec.directory}


def check(argv: list[str], capfd) -> tuple[int, float, str, str]:
    started = time.monotonic()
    code = cli.main(["check", "--timeout", "1s", *argv])
    out, err = capfd.readouterr()
    return code, time.monotonic() - started, out, err


def test_every_unreachable_part_is_a_failed_line_with_its_reason_and_next_step(nothing_answers, capfd):
    spec, address = nothing_answers["spec"], nothing_answers["address"]

    code, seconds, out, err = check([], capfd)

    assert code == EXIT_SOURCE  # the first failed part, Kafka: the source cannot be reached
    assert seconds < 30  # each part held to its 1 s deadline, not to a client's own timeouts (minutes)
    lines = out.splitlines()
    assert lines[0] == f"ok      spec            {spec.path}: pipeline {spec.name} is valid"
    kafka, store, catalog, registry, summary = lines[1:]
    assert kafka.startswith(f"FAILED  kafka           {address} (PLAINTEXT): Kafka is unreachable: nothing answered "
                            f"at {address} (PLAINTEXT) within 1s"), kafka
    assert "next: start the broker (the development stack's: `lakehouse stack up`) or point " \
           "LAKEHOUSE_BOOTSTRAP_SERVERS" in kafka
    assert store.startswith("FAILED  object_store    s3://lakehouse-check/warehouse/lake: warehouse "
                            "s3://lakehouse-check/warehouse/lake of catalog 'lake': nothing answers at "
                            f"http://{address}"), store
    assert "next: check LAKEHOUSE_WAREHOUSE, LAKEHOUSE_S3_ENDPOINT" in store
    assert catalog == ("SKIPPED catalog         lake: not asked: it opens only once its warehouse's object store "
                       "answers; next: fix the object store first")
    assert registry.startswith(f"FAILED  schema_registry http://{address}: ") and "Connection refused" in registry
    assert "next: check LAKEHOUSE_SCHEMA_REGISTRY_URL" in registry
    assert summary == "1 of 5 parts ok; 4 did not pass"
    assert not any(secret in out + err for secret in ("catalog-secret", "registry-secret", "aws-secret"))
    assert list(nothing_answers["home"].iterdir()) == []  # asking created nothing


def test_a_catalog_database_that_does_not_answer_fails_its_line(nothing_answers, monkeypatch, capfd):
    monkeypatch.delenv("LAKEHOUSE_WAREHOUSE")  # a local warehouse: no object store to ask
    monkeypatch.delenv("LAKEHOUSE_SCHEMA_REGISTRY_URL")
    address = nothing_answers["address"]

    code, seconds, out, _ = check(["--pipeline", nothing_answers["spec"].name, "--json"], capfd)

    assert code == EXIT_SOURCE and seconds < 30
    parts = json.loads(out)
    assert [(p["part"], p["status"], p["exit_code"]) for p in parts] == [
        ("spec", "ok", 0), ("kafka", "failed", EXIT_SOURCE), ("catalog", "failed", 1)]
    catalog = parts[2]
    assert catalog["target"] == f"lake at postgresql+psycopg2://lakehouse:***@{address}/lake"
    assert catalog["detail"].startswith(f"catalog 'lake' at postgresql+psycopg2://lakehouse:***@{address}/lake "
                                        f"(LAKEHOUSE_CATALOG_URI) is unavailable")
    assert catalog["next"].startswith("check LAKEHOUSE_CATALOG_URI")
    assert set(parts[0]) == {"part", "target", "status", "detail", "next", "exit_code", "seconds"}
    assert parts[0]["next"] is None and parts[0]["seconds"] >= 0


def test_every_broken_spec_file_is_its_own_failed_line(nothing_answers, capfd):
    folder = nothing_answers["specs"]
    good = (folder / f"{nothing_answers['spec'].name}.yaml").read_text()
    (folder / "sideways.yaml").write_text(good.replace("mode: append", "mode: sideways")
                                          .replace(nothing_answers["spec"].name, "sideways"))
    (folder / "not_yaml.yaml").write_text("name: [unclosed\n")

    code, _, out, _ = check([], capfd)

    assert code == EXIT_CONFIG  # the first failed part: a spec
    specs = [line for line in out.splitlines() if line[8:].startswith("spec ")]
    assert len(specs) == 3
    mode_line = good.splitlines().index("  mode: append") + 1  # each mistake at its file and line
    assert f"FAILED  spec            {folder / 'sideways.yaml'}:{mode_line}: target.mode: 'sideways' is not one of " \
           "append, upsert, cdc; next: fix the field the error names, then run `lakehouse check` again" in specs
    assert any(line.startswith(f"FAILED  spec            {folder / 'not_yaml.yaml'}:1: ") for line in specs), specs
    assert any(line.startswith("ok      spec ") for line in specs)
    assert any(line.startswith("FAILED  kafka ") for line in out.splitlines())  # the other parts are still asked

    code, _, out, _ = check(["--pipeline", "nope"], capfd)
    assert code == EXIT_CONFIG
    assert out.splitlines()[0].startswith("FAILED  spec            pipeline nope: no pipeline named 'nope'")


def test_a_bad_timeout_is_refused_while_parsing(capsys):
    for text, why in (("0s", "'0s' must be longer than 0"), ("2m", "'2m' is longer than 1m"),
                      ("soon", "'soon' is not a duration like 500ms, 5s")):
        with pytest.raises(SystemExit) as info:
            cli.main(["check", "--timeout", text])
        assert info.value.code == 2 and f"argument --timeout: {why}" in capsys.readouterr().err


