"""The Airflow side as an installable provider (providers/lakehouse, distribution airflow-provider-lakehouse).

The end-to-end half of these tests; what they hold the code to is told in tests/unit/provider/test_provider.py.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

import pytest

from lakehouse.core import config
from tests.unit.provider.test_provider import (  # noqa: F401 - fixtures among them
    airflow_test_of,
    connection,
)


def _services_connections(platform: config.PlatformConfig) -> dict[str, dict]:
    """Connections to the parts the `services` fixture runs, from the settings that reach them."""
    registry = urlsplit(platform.schema_registry_url)
    store = platform.object_store
    return {
        "lakehouse_kafka": {"conn_type": "lakehouse_kafka", "host": platform.bootstrap_servers,
                            "extra": dict(platform.kafka_extra)},
        "lakehouse_catalog": {"conn_type": "lakehouse_catalog", "host": platform.catalog_uri,
                              "extra": {"warehouse": platform.warehouse}},
        "lakehouse_object_store": {"conn_type": "lakehouse_object_store", "host": store.endpoint,
                                   "login": store.access_key_id, "password": store.secret_access_key,
                                   "extra": {"region": store.region, "path_style_access": store.path_style_access}},
        "lakehouse_schema_registry": {"conn_type": "lakehouse_schema_registry",
                                      "host": registry._replace(netloc=registry.netloc.rpartition("@")[2]).geturl(),
                                      "login": unquote(registry.username or "") or None,
                                      "password": unquote(registry.password or "") or None},
    }


def _spoil_the_environment(monkeypatch, closed: str) -> None:
    """Every part's variable pointed at a port nobody listens on: only a connection reaches the part."""
    for name, value in {"LAKEHOUSE_BOOTSTRAP_SERVERS": closed, "LAKEHOUSE_CATALOG_URI": f"http://{closed}",
                        "LAKEHOUSE_S3_ENDPOINT": f"http://{closed}",
                        "LAKEHOUSE_SCHEMA_REGISTRY_URL": f"http://{closed}"}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.slow
def test_each_connection_test_reaches_the_real_part_through_the_connection_alone(on_services, monkeypatch,
                                                                                 free_tcp_port):
    from lakehouse.ops import check

    real = _services_connections(on_services)
    closed = f"127.0.0.1:{free_tcp_port}"
    _spoil_the_environment(monkeypatch, closed)
    # the environment alone reaches none of the parts
    alone = config.load(fresh=True)
    assert not check.check_kafka(alone, [], 3.0).ok and not check.check_registry(alone, 3.0).ok
    assert not check.check_catalog(alone, alone.catalog("lake"), 3.0).ok
    # each connection, tested as Airflow tests it (the catalog's with the deployment's object store connection)
    for conn_id, fields in real.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection(conn_id, **fields))
    for conn_id, fields in real.items():
        ok, message = airflow_test_of(monkeypatch, conn_id, **dict(fields))
        assert ok is True, (conn_id, message)
        assert "answer" in message and closed not in message, message
        assert not fields.get("password") or fields["password"] not in message


@pytest.mark.slow
def test_sensors_reach_kafka_the_catalog_and_the_object_store_through_their_connections(on_services, make_spec,
                                                                                        monkeypatch, free_tcp_port):
    from lakehouse.core import topics
    from lakehouse.core import warehouse as warehouse_module
    from lakehouse_airflow.sensors import LagSensor

    spec = make_spec(partitions=1)
    topics.ensure_topics([spec], on_services)
    real = _services_connections(on_services)
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    _spoil_the_environment(monkeypatch, f"127.0.0.1:{free_tcp_port}")
    warehouse_module.forget()  # the store is asked again, with the settings each check has
    sensor = LagSensor(task_id="lag", pipeline=spec.name, max_records=10 ** 9, max_seconds=10 ** 9)
    assert sensor.poke(context={}) is False  # the environment alone reaches nothing
    assert "cannot be checked" in sensor._last.message and f"127.0.0.1:{free_tcp_port}" in sensor._last.message
    for conn_id in ("lakehouse_kafka", "lakehouse_catalog", "lakehouse_object_store"):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection(conn_id, **real[conn_id]))
    checked = LagSensor(task_id="lag", pipeline=spec.name, max_records=10 ** 9, max_seconds=10 ** 9,
                        deferrable=True).execute(context={})
    assert checked["ok"] is True and checked["measured"]["lag_records"] == 0, checked
