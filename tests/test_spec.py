"""The pipeline spec is validated on load, with errors that name the file, the field and why."""

from pathlib import Path

import pytest
import yaml

from lakehouse.spec import SpecError, UnknownPipelineError, load_all, load_pipeline, load_spec, parse_duration

ORDERS = Path(__file__).resolve().parents[1] / "include" / "pipelines" / "orders.yaml"


def write(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load(ORDERS.read_text())
    mutate(raw)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_demo_pipelines_load_as_declared():
    specs = load_all()
    orders, customers = specs["orders"], specs["customers"]
    assert orders.source.topic == "orders" and orders.source.partitions == 3
    assert orders.source.key_field == "order_id" and orders.source.key_required
    assert orders.qualified(orders.target.table) == "lake.raw.orders"
    assert orders.dead_letter_table == "raw.orders_dlq"
    assert orders.target.mode == "append"
    assert [str(p) for p in orders.target.partition_by] == ["day(event_time)"]
    assert orders.contract.names == ("order_id", "customer_id", "amount", "currency", "status", "event_time")
    assert all(f.required for f in orders.contract.fields)
    assert orders.contract.field("status").enum == ("created", "paid", "shipped", "cancelled", "refunded")
    assert orders.contract.field("amount").min == 0
    assert customers.target.mode == "upsert" and customers.target.key == ("customer_id",)


@pytest.mark.parametrize("mutate, field, why", [
    (lambda r: r.pop("name"), "name", "is required"),
    (lambda r: r["source"].update(topic="bad topic!"), "source.topic", "is not valid"),
    (lambda r: r["source"].update(partitions=0), "source.partitions", "must be >= 1"),
    (lambda r: r["source"].update(value_format="xml"), "source.value_format", "is not one of json"),
    (lambda r: r["target"].update(table="Orders"), "target.table", "namespace.table"),
    (lambda r: r["target"].update(mode="merge"), "target.mode", "is not one of append, upsert"),
    (lambda r: r["target"].update(mode="upsert"), "target.key", "upsert mode needs key columns"),
    (lambda r: r["target"].update(key=["nope"]), "target.key[0]", "'nope' is not a contract field"),
    (lambda r: r["target"].update(partition_by=["day(amount)"]), "target.partition_by[0]",
     "needs a timestamp or date column"),
    (lambda r: r["target"].update(partition_by=["bucket(order_id)"]), "target.partition_by[0]",
     "needs a positive width"),
    (lambda r: r["target"].update(partition_by=["weekly(event_time)"]), "target.partition_by[0]",
     "unknown transform"),
    (lambda r: r["dead_letter"].update(table="raw.orders"), "dead_letter.table", "is also a data table"),
    (lambda r: r["contract"]["fields"].append({"name": "amount", "type": "double"}),
     "contract.fields[amount]", "is declared twice"),
    (lambda r: r["contract"]["fields"][2].update(type="money"), "contract.fields[amount].type",
     "is not one of"),
    (lambda r: r["contract"]["fields"][2].update(min=10, max=1), "contract.fields[amount].min",
     "greater than max"),
    (lambda r: r["contract"]["fields"][3].update(pattern="[A-Z"), "contract.fields[currency].pattern",
     "not a regular expression"),
    (lambda r: r["contract"]["fields"][4].update(enum=[]), "contract.fields[status].enum", "non-empty list"),
    (lambda r: r["contract"]["fields"].append({"name": "_kafka", "type": "string"}),
     "contract.fields[_kafka]", "reserved"),
    (lambda r: r["trigger"].update(interval="soon"), "trigger.interval", "not a duration"),
    (lambda r: r["slo"].update(lag_records=-1), "slo.lag_records", "must be >= 0"),
    (lambda r: r.update(colour="blue"), "colour", "unknown field"),
    (lambda r: r["target"].update(fanout={"field": "region", "routes": {"eu": "raw.orders_eu"}}),
     "target.fanout.field", "'region' is not a contract field"),
])
def test_invalid_specs_fail_with_file_field_and_reason(tmp_path, mutate, field, why):
    path = write(tmp_path, mutate)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.path == str(path)
    assert info.value.field == field
    assert why in info.value.why
    assert str(path) in str(info.value) and field in str(info.value)


def test_unreadable_and_non_yaml_files_are_explained(tmp_path):
    with pytest.raises(SpecError, match="cannot be read"):
        load_spec(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="is not valid YAML"):
        load_spec(broken)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(SpecError, match="is empty"):
        load_spec(empty)


def test_unknown_pipeline_lists_the_known_ones(tmp_path):
    with pytest.raises(UnknownPipelineError, match="known: customers, orders"):
        load_pipeline("invoices")


def test_two_files_cannot_declare_the_same_pipeline(tmp_path):
    (tmp_path / "a.yaml").write_text(ORDERS.read_text())
    (tmp_path / "b.yaml").write_text(ORDERS.read_text())
    with pytest.raises(SpecError, match="already declared"):
        load_all(tmp_path)


def test_fanout_routes_become_tables_behind_the_default_one(tmp_path):
    spec = load_spec(write(tmp_path, lambda r: r["target"].update(
        fanout={"field": "currency", "routes": {"EUR": "raw.orders_eur", "USD": "raw.orders_usd"}})))
    assert spec.target.tables == ("raw.orders", "raw.orders_eur", "raw.orders_usd")


@pytest.mark.parametrize("text, seconds", [("500ms", 0.5), ("5s", 5), ("2m", 120), ("1h", 3600), ("7d", 604800),
                                           (3, 3.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds
