"""The pipeline spec is validated on load, with errors that name the file, the field and why."""

from pathlib import Path

import pytest
import yaml

from lakehouse.core.config import REPO_ROOT
from lakehouse.core.errors import ConfigurationError
from lakehouse.core.spec import (
    CAPS,
    BrokenSpecsError,
    SpecError,
    UnknownPipelineError,
    load_all,
    load_pipeline,
    load_spec,
    load_specs,
    parse_duration,
)

ORDERS = REPO_ROOT / "include" / "pipelines" / "orders.yaml"
CUSTOMERS = ORDERS.with_name("customers.yaml")


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
    payments, inventory = specs["payments"], specs["inventory"]
    # Avro values with their writer schema in the folder beside the spec, caught up by scheduled `--once` jobs
    assert payments.source.value_format == "avro" and [s[:2] for s in payments.source.schemas] == [(1, "AVRO")]
    assert [f.type_text for f in payments.contract.fields] == [
        "uuid", "string", "decimal(12,2)", "string", "string", "string", "timestamp",
        "struct<brand:string,last4:string>", "map<string,string>"]
    assert payments.trigger.mode == inventory.trigger.mode == "scheduled"
    # a Debezium change stream in JSON: an upsert table keyed by the primary key from the key records
    assert inventory.is_cdc and inventory.source.envelope == "debezium" and inventory.source.key_format == "json"
    assert inventory.target.mode == "upsert" and inventory.target.key == ("product_id",)
    assert inventory.source.topic == "warehouse.public.inventory" and inventory.tombstones_delete


@pytest.mark.parametrize("mutate, field, why", [
    (lambda r: r.pop("name"), "name", "is required"),
    (lambda r: r["source"].update(topic="bad topic!"), "source.topic", "is not valid"),
    (lambda r: r["source"].update(partitions=0), "source.partitions", "must be >= 1"),
    (lambda r: r["source"].update(value_format="xml"), "source.value_format", "is not one of json"),
    (lambda r: r["target"].update(table="Orders"), "target.table", "namespace.table"),
    (lambda r: r["target"].update(mode="merge"), "target.mode", "is not one of append, upsert"),
    (lambda r: r["target"].update(mode="upsert"), "target.key", "upsert mode needs key columns"),
    (lambda r: r["target"].update(mode="upsert", key=["amount"]), "target.key[0]", "is a double"),
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
    # names are matched in full: a trailing newline is not part of a name
    (lambda r: r.update(name="orders\n"), "name", "is not valid"),
    (lambda r: r["target"].update(table="raw.orders\n"), "target.table", "namespace.table"),
    (lambda r: r["dead_letter"].update(table="raw.orders_dlq\n"), "dead_letter.table", "namespace.table"),
    (lambda r: r["publish"].update(view="serve.orders\n"), "publish.view", "namespace.table"),
    (lambda r: r["source"].update(topic="orders\n"), "source.topic", "is not valid"),
    (lambda r: r["source"].update(topic=".."), "source.topic", "not a topic name Kafka accepts"),
    (lambda r: r["target"].update(partition_by=["day(event_time)\n"]), "target.partition_by[0]",
     "is not a partition transform"),
    (lambda r: r["trigger"].update(interval="5s\n"), "trigger.interval", "not a duration"),
    (lambda r: r.update(name="o" * 129), "name", "at most 128 characters"),
    # durations: finite, positive where zero makes no sense, capped
    (lambda r: r["trigger"].update(interval=float("inf")), "trigger.interval", "must be finite"),
    (lambda r: r["trigger"].update(interval=float("nan")), "trigger.interval", "must be finite"),
    (lambda r: r["trigger"].update(interval="0s"), "trigger.interval", "must be longer than 0"),
    (lambda r: r["trigger"].update(interval="2d"), "trigger.interval", "longer than 1d"),
    (lambda r: r["trigger"].update(interval=-5), "trigger.interval", "0 or more"),
    (lambda r: r["retention"].update(replay_window="0s"), "retention.replay_window", "must be longer than 0"),
    (lambda r: r["retention"].update(outage_budget=0), "retention.outage_budget", "must be longer than 0"),
    (lambda r: r["retention"].update(outage_budget="3651d"), "retention.outage_budget", "longer than 3650d"),
    (lambda r: r["retention"].update(delete_after="0s"), "retention.delete_after", "must be longer than 0"),
    (lambda r: r["supervision"].update(restart_backoff="25h"), "supervision.restart_backoff", "longer than 1d"),
    # sizes and counts: capped
    (lambda r: r["source"].update(partitions=100_001), "source.partitions", "must be <= 100000"),
    (lambda r: r["source"].update(max_value_bytes=2 ** 31), "source.max_value_bytes", "the platform's cap"),
    (lambda r: r["source"].update(retention_ms=0), "source.retention_ms", "use -1 for unlimited"),
    (lambda r: r["source"].update(retention_ms=10 ** 15), "source.retention_ms", "the platform's cap"),
    (lambda r: r["target"].update(target_file_size_mb=10 ** 9), "target.target_file_size_mb", "the platform's cap"),
    (lambda r: r["trigger"].update(max_records_per_batch=10 ** 10), "trigger.max_records_per_batch", "cap"),
    (lambda r: r["slo"].update(lag_records=10 ** 13), "slo.lag_records", "the platform's cap"),
    (lambda r: r["supervision"].update(max_restarts=1000), "supervision.max_restarts", "the platform's cap"),
    (lambda r: r["target"].update(partition_by=["bucket(" + "9" * 5000 + ", order_id)"]),
     "target.partition_by[0]", "needs a positive width of at most 100000"),
    (lambda r: r["contract"]["fields"][2].update(min=float("-inf")), "contract.fields[amount].min",
     "must be a finite number"),
    (lambda r: r["contract"]["fields"][2].update(max=float("nan")), "contract.fields[amount].max",
     "must be a finite number"),
    # table properties: the platform's and Iceberg's own are refused, values are scalars
    (lambda r: r["target"].update(properties={"lakehouse.pipeline": "someone_else"}),
     "target.properties.lakehouse.pipeline", "are the platform's"),
    (lambda r: r["target"].update(properties={"format-version": 1}), "target.properties.format-version",
     "creates its tables at format version 2"),
    (lambda r: r["target"].update(properties={"write.wap.enabled": False}), "target.properties.write.wap.enabled",
     "managed by Iceberg or by the platform"),
    (lambda r: r["target"].update(properties={"commit.retry.num-retries": [1, 2]}),
     "target.properties.commit.retry.num-retries", "a string of at most 4096 characters"),
    (lambda r: r["target"].update(properties={"commit.retry.num-retries": None}),
     "target.properties.commit.retry.num-retries", "a finite (64-bit) number or a boolean"),
    (lambda r: r["target"].update(properties={"bad key": "x"}), "target.properties", "is not a property name"),
    # one table or view per name, the ops timeline is the platform's
    (lambda r: r["publish"].update(view="raw.orders_dlq"), "publish.view",
     "'raw.orders_dlq' is also a dead-letter table of this pipeline (dead_letter.table)"),
    (lambda r: r["target"].update(table="ops.pipeline_events"), "target.table", "the platform's ops timeline"),
    (lambda r: r["publish"].update(view="ops.pipeline_events"), "publish.view", "the platform's ops timeline"),
    (lambda r: r["target"].update(fanout={"field": "currency", "routes": {"EUR": "raw.orders_dlq"}}),
     "dead_letter.table", "is also a data table of this pipeline (target.fanout.routes.EUR)"),
    (lambda r: r["target"].update(fanout={"field": "currency", "routes": {"EUR": "other.orders"}}),
     "publish.view", "'serve.orders' is also a readers' view of this pipeline (publish.view)"),
    # schedules become Airflow timetables: a bad one would break every pipeline's DAG file
    (lambda r: r["maintenance"].update(schedule="every hour"), "maintenance.schedule", "is not a schedule"),
    (lambda r: r["publish"].update(schedule="61 * * * *"), "publish.schedule", "is not a schedule"),
    (lambda r: r["publish"].update(branch="main"), "publish.branch", "the audit branch"),
    (lambda r: r.update(description={"text": "x"}), "description", "must be a string"),
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
    with pytest.raises(UnknownPipelineError, match="known: customers, inventory, orders, payments"):
        load_pipeline("invoices")


def test_two_files_cannot_declare_the_same_pipeline(tmp_path):
    (tmp_path / "a.yaml").write_text(ORDERS.read_text())
    (tmp_path / "b.yaml").write_text(ORDERS.read_text())
    (tmp_path / "customers.yaml").write_text(CUSTOMERS.read_text())
    found = load_specs(tmp_path)
    assert list(found.specs) == ["customers"]
    a, b = str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")
    assert list(found.errors) == [a, b]
    assert str(found.errors[a]) == f"{a}:2: name: pipeline 'orders' is also declared in {b}; pipeline names must be unique"
    assert str(found.errors[b]).startswith(f"{b}:2: name: pipeline 'orders' is also declared in {a}")
    assert load_all(tmp_path) == found.specs
    with pytest.raises(SpecError, match="also declared"):
        load_pipeline("orders", tmp_path)


def copy_spec(directory: Path, name: str, mutate=lambda raw: None, template: Path = ORDERS) -> Path:
    """`template` as pipeline `name` with its own topic, tables and view, changed by `mutate`, in `directory`."""
    raw = yaml.safe_load(template.read_text())
    raw["name"] = name
    raw["source"]["topic"] = name
    raw["target"]["table"] = f"raw.{name}"
    raw["dead_letter"]["table"] = f"raw.{name}_dlq"
    raw["publish"]["view"] = f"serve.{name}"
    mutate(raw)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("mutate, table, field, what", [
    (lambda r: r["target"].update(table="raw.first"), "raw.first", "target.table", "a data table"),
    (lambda r: r["dead_letter"].update(table="raw.first"), "raw.first", "dead_letter.table", "a data table"),
    (lambda r: r["target"].update(table="raw.first_dlq"), "raw.first_dlq", "target.table", "a dead-letter table"),
    (lambda r: r["target"].update(fanout={"field": "currency", "routes": {"EUR": "raw.first"}}), "raw.first",
     "target.fanout.routes.EUR", "a data table"),
    (lambda r: r["publish"].update(view="raw.first"), "raw.first", "publish.view", "a data table"),
    (lambda r: r["publish"].update(view="serve.first"), "serve.first", "publish.view", "a readers' view"),
    (lambda r: r["target"].update(table="serve.first"), "serve.first", "target.table", "a readers' view"),
    (lambda r: r.update(candidate_for="first", source={**r["source"], "topic": "first"},
                        target={**r["target"], "table": "raw.first"}), "raw.first", "target.table", "a data table"),
])
def test_a_table_or_view_claimed_by_two_specs_breaks_both_and_spares_the_rest(tmp_path, mutate, table, field, what):
    first = copy_spec(tmp_path, "first")
    second = copy_spec(tmp_path, "second", mutate)
    copy_spec(tmp_path, "third")
    found = load_specs(tmp_path)
    assert list(found.specs) == ["third"]
    assert set(found.errors) == {str(first), str(second)}
    error = found.errors[str(second)]
    assert (error.path, error.field) == (str(second), field)
    assert error.why.startswith(f"{table!r} is also {what} of pipeline 'first' ({first}); a table or view has one owner")
    assert f"of pipeline 'second' ({second})" in found.errors[str(first)].why
    assert load_pipeline("third", tmp_path).name == "third"
    with pytest.raises(SpecError) as info:
        load_pipeline("first", tmp_path)
    assert str(info.value) == str(found.errors[str(first)])


def test_the_same_table_name_in_two_catalogs_is_two_tables(tmp_path):
    copy_spec(tmp_path, "first")
    copy_spec(tmp_path, "second", lambda r: r["target"].update(table="raw.first", catalog="other"))
    assert list(load_specs(tmp_path).specs) == ["first", "second"]


def test_a_broken_sibling_leaves_the_other_pipelines_working(tmp_path):
    copy_spec(tmp_path, "good")
    (tmp_path / "named.yaml").write_text("name: bad_by_name\ntarget: {mode: sideways}\n")
    (tmp_path / "bad_by_stem.yaml").write_text("name: [unclosed\n")
    found = load_specs(tmp_path)
    assert list(found.specs) == ["good"]
    assert found.declared == {str(tmp_path / "bad_by_stem.yaml"): "bad_by_stem",
                              str(tmp_path / "named.yaml"): "bad_by_name"}
    assert load_pipeline("good", tmp_path).name == "good"
    assert load_all(tmp_path) == found.specs
    with pytest.raises(SpecError, match="named.yaml: contract: is required"):
        load_pipeline("bad_by_name", tmp_path)
    with pytest.raises(SpecError, match="bad_by_stem.yaml:1: \\(file\\): is not valid YAML"):
        load_pipeline("bad_by_stem", tmp_path)
    with pytest.raises(UnknownPipelineError, match="no pipeline named 'invoices' .*known: good"):
        load_pipeline("invoices", tmp_path)
    with pytest.raises(BrokenSpecsError) as info:
        found.raise_errors()
    assert str(info.value).split("\n", 1)[1] == "\n".join(f"- {p}" for e in found.errors.values() for p in e.problems)
    assert 'in "bad_by_stem.yaml", line 1, column 7' in str(found.errors[str(tmp_path / "bad_by_stem.yaml")])


def test_spec_errors_are_configuration_errors_and_keep_their_old_bases():
    assert issubclass(SpecError, ConfigurationError) and issubclass(SpecError, ValueError)
    assert issubclass(UnknownPipelineError, ConfigurationError) and issubclass(UnknownPipelineError, LookupError)
    assert issubclass(BrokenSpecsError, ConfigurationError)


def test_owned_tables_and_views_list_everything_a_spec_claims(tmp_path):
    spec = load_spec(write(tmp_path, lambda r: r["target"].update(
        fanout={"field": "currency", "routes": {"EUR": "raw.orders_eur", "USD": "raw.orders"}})))
    assert spec.owned_tables == ("raw.orders", "raw.orders_eur", "raw.orders_dlq")
    assert spec.views == ("serve.orders", "serve.orders_eur")


def test_ordinary_table_properties_are_kept_as_strings(tmp_path):
    spec = load_spec(write(tmp_path, lambda r: r["target"].update(properties={
        "commit.retry.num-retries": 0, "write.metadata.metrics.default": "full",
        "write.spark.fanout.enabled": True, "write.parquet.bloom-filter-fpp.column.customer_id": 0.05})))
    assert spec.target.properties == {"commit.retry.num-retries": "0", "write.metadata.metrics.default": "full",
                                      "write.spark.fanout.enabled": "true",
                                      "write.parquet.bloom-filter-fpp.column.customer_id": "0.05"}


def test_caps_are_inclusive(tmp_path):
    spec = load_spec(write(tmp_path, lambda r: (
        r["source"].update(partitions=CAPS["source.partitions"], retention_ms=-1),
        r["trigger"].update(interval="1d", max_records_per_batch=CAPS["trigger.max_records_per_batch"]),
        r["maintenance"].update(orphan_safety_window="100d"),
        r["retention"].update(replay_window="3650d"))))
    assert spec.source.partitions == 100_000 and spec.source.retention_ms == -1
    assert spec.trigger.interval_s == 86400 and spec.retention.replay_window_s == 3650 * 86400


def test_fanout_routes_become_tables_behind_the_default_one(tmp_path):
    spec = load_spec(write(tmp_path, lambda r: r["target"].update(
        fanout={"field": "currency", "routes": {"EUR": "raw.orders_eur", "USD": "raw.orders_usd"}})))
    assert spec.target.tables == ("raw.orders", "raw.orders_eur", "raw.orders_usd")


@pytest.mark.parametrize("text, seconds", [("500ms", 0.5), ("5s", 5), ("2m", 120), ("1h", 3600), ("7d", 604800),
                                           (3, 3.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, "-1s", "1e3s", " 5s", "5s\n", "3651d", True,
                                   10 ** 400, "9" * 400 + "d", None, [5]])
def test_durations_refuse_what_is_not_a_finite_duration_within_the_cap(value):
    with pytest.raises(ValueError):
        parse_duration(value)
