"""A real schema registry (Apicurio Registry 3, its Confluent-compatible API behind HTTP basic auth, started by the
stack: the `services` home of conftest) between producers and the pipeline (end to end):

- `lakehouse produce` registers the contract's writer schemas under the topic's subjects with the stack user's
  credentials, and the ingest job's driver fetches them by id: rows land typed, exactly once;
- credentials the registry refuses stop the job at once naming the setting, writing nothing;
- the registry stopped mid-run (an outage): the job waits within its retry budget and resumes when it is back;
- schema evolution under the registry's own compatibility rule: a backward-compatible version is accepted (the
  table evolves), an incompatible one is refused by the registry (HTTP 409), not by the pipeline.

The mock client (confluent-kafka's MockSchemaRegistryClient, `mock://`) serves the unit layer only.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from e2e import assert_exactly_once, lakehouse, pipeline, rows, run_cli, send  # noqa: F401 (pipeline: a fixture)
from lakehouse.core import config
from lakehouse.core.catalog import open_catalog
from lakehouse.ingest.schema_store import parse_schema, register_schema, registry_client
from lakehouse.ingest.wire import wire_value
from lakehouse_dev import produce
from lakehouse_dev import stack as stack_module
from polling import wait_until

pytestmark = pytest.mark.slow

FIELDS = [{"name": "order_id", "type": "string", "required": True},
          {"name": "amount", "type": "double", "required": True, "min": 0},
          {"name": "currency", "type": "string", "required": True}]


@pytest.fixture
def registered(platform, pipeline, registry_url, monkeypatch):
    """An Avro pipeline whose writer schemas live in the registry only (no schema folder)."""
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", registry_url)
    return pipeline(fields=FIELDS, partition_by=None, publish={"view": None}, partitions=1,
                    key={"field": "order_id", "required": True}, source={"value_format": "avro"})


def test_produced_schemas_are_registered_and_the_job_fetches_them_with_basic_auth(platform, registered, spark):
    spec = registered
    report = produce.produce(spec, 200, bad_ratio=0.05, seed=70, platform=config.load(fresh=True))
    registry = config.load(fresh=True).schema_registry()
    assert registry["basic.auth.user.info"].startswith("lakehouse:")
    client = registry_client(registry)
    assert f"{spec.source.topic}-value" in client.get_subjects()
    done = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert assert_exactly_once(platform, spec) == 200
    assert len(rows(platform, spec, spec.target.table)) == 200 - sum(report.bad_by_kind.values())


def test_refused_credentials_stop_the_job_at_once_naming_the_setting(platform, registered, spark, registry_url,
                                                                     monkeypatch):
    spec = registered
    produce.produce(spec, 20, seed=71, platform=config.load(fresh=True))
    parts = urlsplit(registry_url)
    wrong = parts._replace(netloc=f"lakehouse:not-the-password@{parts.hostname}:{parts.port}").geturl()
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", wrong)
    refused = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "LAKEHOUSE_SCHEMA_REGISTRY_URL" in refused.stderr and "not-the-password" not in refused.stderr
    assert not open_catalog(platform, spec.catalog).table_exists(spec.target.table)  # nothing written


def test_the_job_waits_out_a_registry_outage_and_resumes(platform, registered, spark, services, registry_url):
    spec = registered
    produce.produce(spec, 60, seed=72, platform=config.load(fresh=True))
    outage = threading.Thread(target=stack_module.restart, args=("registry", 10.0, services["home"]))
    outage.start()  # down for 10 s, then starting again (several seconds more)
    wait_until(lambda: not answers(registry_url), 60, "the registry to stop")
    try:  # a process of its own: no schema cached yet, it must ask the registry, and meets it down
        done = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    finally:
        outage.join(timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert assert_exactly_once(platform, spec) == 60
    assert "schema registry" in done.stderr.lower()  # it said what it was waiting for


def answers(url: str) -> bool:
    """Whether the registry at `url` answers HTTP at all."""
    parts = urlsplit(url)
    try:
        urllib.request.urlopen(f"http://{parts.hostname}:{parts.port}/apis/ccompat/v7/subjects", timeout=2)
    except urllib.error.HTTPError:
        return True  # it answered (401: no credentials given here)
    except OSError:
        return False
    return True


def test_the_registrys_compatibility_rule_decides_what_a_subject_takes(platform, registered, spark):
    spec = registered
    registry = config.load(fresh=True).schema_registry()
    client = registry_client(registry)
    subject = f"{spec.source.topic}-value"
    v1 = {"type": "record", "name": "Order", "fields": [{"name": "order_id", "type": "string"},
                                                         {"name": "amount", "type": "double"},
                                                         {"name": "currency", "type": "string"}]}
    first = register_schema(registry, subject, json.dumps(v1))
    client.set_compatibility(subject, "BACKWARD")
    v2 = {**v1, "fields": [*v1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
    second = register_schema(registry, subject, json.dumps(v2))  # a new optional field: backward compatible
    assert second != first
    v3 = {**v1, "fields": [f for f in v1["fields"] if f["name"] != "currency"] +
          [{"name": "currency", "type": "int"}]}
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    with pytest.raises(SchemaRegistryError) as refused:
        register_schema(registry, subject, json.dumps(v3))
    assert refused.value.http_status_code == 409  # the registry's rule, not the pipeline's
    encoded = wire_value(second, parse_schema(json.dumps(v2)),
                         {"order_id": "o-1", "amount": 3.5, "currency": "EUR", "note": "gift"})
    send(platform, spec.source.topic, [(b"o-1", encoded)])
    done = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(r["order_id"], r["amount"]) for r in rows(platform, spec, spec.target.table)] == [("o-1", 3.5)]
