"""A broken spec file reports every mistake it holds at once, each with its line, its key path and why,
and names the word it most likely meant where a key or a value is a typo of one."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse.core.config import REPO_ROOT
from lakehouse import cli
from lakehouse.core.errors import BrokenSpecsError, SpecError
from lakehouse.core.safe_yaml import parse_yaml
from lakehouse.core.spec import (
    ADDITIVE_POLICIES,
    CONTRACT_SOURCES,
    DATE_UNITS,
    ENVELOPES,
    FIELD_TYPES,
    INCOMPATIBLE_POLICIES,
    KEY_FORMATS,
    MODES,
    PARTITION_TRANSFORMS,
    SCHEDULE_PRESETS,
    TIMESTAMP_UNITS,
    TRIGGER_MODES,
    VALUE_FORMATS,
    PipelineSpec,
    load_spec,
    load_specs,
)
from lakehouse.core.vocabulary import ELEMENT_KEYS, FIELD_KEYS, SECTION_KEYS

ORDERS = REPO_ROOT / "include" / "pipelines" / "orders.yaml"
TEMPLATE = yaml.safe_load(ORDERS.read_text())
FIELD_INDEX = {f["name"]: i for i, f in enumerate(TEMPLATE["contract"]["fields"])}


def dump(raw: dict) -> str:
    """Block style: every scalar on its own line, so a mistake's line is the line its text is on."""
    return yaml.safe_dump(raw, sort_keys=False, default_flow_style=False, allow_unicode=True)


def field_of(raw: dict, name: str) -> dict:
    return raw["contract"]["fields"][FIELD_INDEX[name]]


def rename(mapping: dict, old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


# Independent mistakes, each in its own place of the orders spec: (change, the text on the mistake's line,
# the key path reported, what the reason says).
MISTAKES = [
    (lambda r: r["target"].update(mode="apend"), "mode: apend", "target.mode", "did you mean 'append'?"),
    (lambda r: r["source"].update(value_format="jsn"), "value_format: jsn", "source.value_format",
     "did you mean 'json'?"),
    (lambda r: rename(r, "trigger", "triger"), "triger:", "triger", "unknown field"),
    (lambda r: rename(r["slo"], "lag_records", "lag_recrods"), "lag_recrods:", "slo.lag_recrods",
     "did you mean 'lag_records'?"),
    (lambda r: field_of(r, "amount").update(type="dubble"), "type: dubble", "contract.fields[amount].type",
     "did you mean 'double'?"),
    # event_time is also the partition column: its mistake is reported once, not again by partition_by
    (lambda r: field_of(r, "event_time").update(type="timestmp"), "type: timestmp",
     "contract.fields[event_time].type", "did you mean 'timestamp'?"),
    (lambda r: field_of(r, "status").update(enum=[]), "enum: []", "contract.fields[status].enum", "non-empty list"),
    (lambda r: rename(field_of(r, "customer_id"), "required", "requird"), "requird:",
     f"contract.fields[{FIELD_INDEX['customer_id']}].requird", "did you mean 'required'?"),
    (lambda r: r["maintenance"].update(schedule="@hourlly"), "@hourlly", "maintenance.schedule",
     "did you mean '@hourly'?"),
    (lambda r: r["publish"].update(branch="main"), "branch: main", "publish.branch", "the audit branch"),
    (lambda r: r["source"].update(partitions=0), "partitions: 0", "source.partitions", "must be >= 1"),
    (lambda r: r["schema_policy"].update(on_additive="evolv"), "on_additive: evolv", "schema_policy.on_additive",
     "did you mean 'evolve'?"),
    (lambda r: r["retention"].update(outage_budget="0s"), "outage_budget: 0s", "retention.outage_budget",
     "must be longer than 0"),
    (lambda r: r["supervision"].update(max_restarts=-1), "max_restarts: -1", "supervision.max_restarts",
     "must be >= 0"),
    (lambda r: r["dead_letter"].update(table="Raw.Orders_DLQ"), "Raw.Orders_DLQ", "dead_letter.table",
     "namespace.table"),
    (lambda r: r["source"]["key"].update(required="sure"), "required: sure", "source.key.required",
     "must be true or false"),
    (lambda r: r["target"].update(partition_by=["dya(event_time)"]), "dya(event_time)", "target.partition_by[0]",
     "did you mean 'day'?"),
    (lambda r: r["target"].update(key=["order_idd"]), "- order_idd", "target.key[0]",
     "'order_idd' is not a contract field; did you mean 'order_id'?"),
    (lambda r: r["slo"].update(freshness="1 minute"), "freshness: 1 minute", "slo.freshness", "not a duration"),
    (lambda r: r["source"].update(topic="orders topic"), "topic: orders topic", "source.topic", "is not valid"),
    (lambda r: r.update(colour="blue"), "colour: blue", "colour", "unknown field"),
]


def line_with(text: str, needle: str) -> int:
    found = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(found) == 1, (needle, found)
    return found[0]


@settings(max_examples=60, deadline=None, database=None)
@given(chosen=st.lists(st.sampled_from(range(len(MISTAKES))), min_size=2, max_size=7, unique=True))
def test_every_independent_mistake_is_reported_once_at_its_line(tmp_path_factory, chosen):
    raw = copy.deepcopy(TEMPLATE)
    for i in chosen:
        MISTAKES[i][0](raw)
    text = dump(raw)
    path = tmp_path_factory.mktemp("mistakes") / "orders.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    error = info.value
    wanted = {(line_with(text, MISTAKES[i][1]), MISTAKES[i][2]) for i in chosen}
    assert [(p.line, p.field) for p in error.problems] == sorted(wanted), str(error)
    whys = {p.field: p.why for p in error.problems}
    for i in chosen:
        _, _, where, why = MISTAKES[i]
        assert why in whys[where], (where, whys[where])
    assert str(error).splitlines() == [f"{path}:{p.line}: {p.field}: {p.why}" for p in error.problems]
    assert (error.line, error.field, error.why) == (error.problems[0].line, error.problems[0].field,
                                                    error.problems[0].why)


def test_a_message_names_file_line_key_path_and_the_word_meant(tmp_path):
    text = ORDERS.read_text().replace("{name: amount, type: double", "{name: amount, type: strng")
    path = tmp_path / "orders.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    line = line_with(text, "type: strng")
    assert str(info.value) == (f"{path}:{line}: contract.fields[amount].type: 'strng' is not one of "
                               f"{', '.join(FIELD_TYPES)}; did you mean 'string'?")
    assert info.value.problems == (info.value,)


# ----------------------------------------------------------------------------------- one mistake, one error

@pytest.mark.parametrize("change, field", [
    # a misspelt required key is unknown, not also missing
    (lambda r: rename(r["source"], "topic", "topik"), "source.topik"),
    (lambda r: rename(r["dead_letter"], "table", "tabel"), "dead_letter.tabel"),
    (lambda r: rename(r, "contract", "contrat"), "contrat"),
    # a field with a mistake is not also "not a contract field" where the key, a partition or a route names it
    (lambda r: field_of(r, "order_id").update(type="strnig"), "contract.fields[order_id].type"),
    (lambda r: (field_of(r, "currency").update(max_length="long"),
                r["target"].update(fanout={"field": "currency", "routes": {"EUR": "raw.orders_eur"}})),
     "contract.fields[currency].max_length"),
    (lambda r: (field_of(r, "customer_id").update(name="Customer Id"), r["target"].update(key=["customer_id"])),
     f"contract.fields[{FIELD_INDEX['customer_id']}].name"),
    (lambda r: r.pop("contract"), "contract"),
    # a refused interval is not also compared with the orphan window; a broken source not read again
    (lambda r: r["trigger"].update(interval="soon"), "trigger.interval"),
    (lambda r: r.update(source=5), "source"),
    (lambda r: r.update(contract={"from": "writer_schemaa"}), "contract.from"),
])
def test_one_mistake_is_one_error(tmp_path, change, field):
    raw = copy.deepcopy(TEMPLATE)
    change(raw)
    path = tmp_path / "orders.yaml"
    path.write_text(dump(raw))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert [p.field for p in info.value.problems] == [field], str(info.value)


def test_a_field_declared_twice_is_reported_at_the_second_declaration(tmp_path):
    raw = copy.deepcopy(TEMPLATE)
    raw["contract"]["fields"].append({"name": "amount", "type": "double"})
    text = dump(raw)
    path = tmp_path / "orders.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    lines = [n for n, line in enumerate(text.splitlines(), 1) if line == "  - name: amount"]
    assert (info.value.field, info.value.line) == ("contract.fields[amount]", lines[1])


def test_a_yaml_syntax_error_names_its_line(tmp_path):
    path = tmp_path / "orders.yaml"
    path.write_text(ORDERS.read_text().replace("  partitions: 3", "  partitions: 3: 4"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.line == line_with(ORDERS.read_text(), "  partitions: 3")
    assert str(info.value).startswith(f"{path}:{info.value.line}: (file): is not valid YAML: mapping values")
    path.write_text(ORDERS.read_text() + "verify: {schedule: '@daily'\n")  # never closed: where it opens
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.line == len(ORDERS.read_text().splitlines()) + 1


# --------------------------------------------------------------------------------------- did you mean

def misspelt(word: str) -> str:
    """A typo of `word`: two letters swapped, or (short words) one doubled."""
    return word[0] + word[2] + word[1] + word[3:] if len(word) >= 4 else word + word[-1]


KEY_CASES = [(section, key) for section, keys in SECTION_KEYS.items() for key in keys] \
    + [("contract.fields[0]", key) for key in FIELD_KEYS] \
    + [("contract.fields[metadata].values", key) for key in ELEMENT_KEYS]


@pytest.mark.parametrize("section, key", KEY_CASES, ids=[f"{s}.{k}" for s, k in KEY_CASES])
def test_a_misspelt_key_names_the_key_meant(tmp_path, section, key):
    raw = yaml.safe_load((ORDERS.with_name("payments.yaml")).read_text())
    raw["source"]["schemas"] = str(ORDERS.parent / "schemas" / "payments")
    if section.startswith("contract.fields[metadata]"):
        here = next(f for f in raw["contract"]["fields"] if f["name"] == "metadata")
        here = here.setdefault("values", {"type": "string"})
    elif section.startswith("contract.fields[0]"):
        here = raw["contract"]["fields"][0]
    else:
        here = raw
        for part in filter(None, section.split(".")):
            here = here.setdefault(part, {}) if isinstance(here.get(part), dict | None) else here[part]
    here[misspelt(key)] = here.pop(key, "x")
    path = tmp_path / "spec.yaml"
    path.write_text(dump(raw))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    where = f"{section}.{misspelt(key)}" if section else misspelt(key)
    found = {p.field: p.why for p in info.value.problems}
    assert where in found, str(info.value)
    assert found[where].startswith("unknown field (allowed: ") and found[where].endswith(f"; did you mean {key!r}?")


def words(place: str, choices, put) -> list:
    return [pytest.param(place, word, put, id=f"{place}={word}") for word in choices]


WORD_CASES = [
    *words("source.value_format", VALUE_FORMATS, lambda r, w: r["source"].update(value_format=w)),
    *words("source.key.format", KEY_FORMATS, lambda r, w: r["source"]["key"].update(format=w)),
    *words("source.envelope", ENVELOPES, lambda r, w: r["source"].update(envelope=w)),
    *words("target.mode", MODES, lambda r, w: r["target"].update(mode=w)),
    *words("schema_policy.on_additive", ADDITIVE_POLICIES, lambda r, w: r["schema_policy"].update(on_additive=w)),
    *words("schema_policy.on_incompatible", INCOMPATIBLE_POLICIES,
           lambda r, w: r["schema_policy"].update(on_incompatible=w)),
    *words("trigger.mode", TRIGGER_MODES, lambda r, w: r["trigger"].update(mode=w)),
    *words("maintenance.schedule", SCHEDULE_PRESETS, lambda r, w: r["maintenance"].update(schedule=w)),
    *words("contract.from", CONTRACT_SOURCES, lambda r, w: r["contract"].update(**{"from": w})),
    *words("contract.fields[amount].type", [t for t in FIELD_TYPES if t != "decimal"],
           lambda r, w: field_of(r, "amount").update(type=w)),
    *words("contract.fields[event_time].unit", TIMESTAMP_UNITS, lambda r, w: field_of(r, "event_time").update(unit=w)),
    *words("contract.fields[day].unit", DATE_UNITS,
           lambda r, w: r["contract"]["fields"].append({"name": "day", "type": "date", "unit": w})),
    *words("target.partition_by[0]", PARTITION_TRANSFORMS,
           lambda r, w: r["target"].update(partition_by=[f"{w}(event_time)"])),
]


@pytest.mark.parametrize("where, word, put", WORD_CASES)
def test_a_misspelt_word_names_the_word_meant(tmp_path, where, word, put):
    raw = copy.deepcopy(TEMPLATE)
    typo = word + word[-1]  # one letter doubled: the nearest word is still the one meant
    put(raw, typo)
    path = tmp_path / "orders.yaml"
    path.write_text(dump(raw))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    found = {p.field: p.why for p in info.value.problems}
    assert where in found, str(info.value)
    assert found[where].endswith(f"did you mean {word!r}?"), found[where]


def test_a_word_far_from_every_choice_gets_no_guess(tmp_path):
    raw = copy.deepcopy(TEMPLATE)
    raw["target"]["mode"] = "sideways"
    path = tmp_path / "orders.yaml"
    path.write_text(dump(raw))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.why == "'sideways' is not one of append, upsert, cdc"


# ------------------------------------------------------------------------------------- where it is told

def test_the_folder_the_cli_and_broken_specs_error_list_every_mistake(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "pipelines"
    folder.mkdir()
    raw = copy.deepcopy(TEMPLATE)
    raw["target"]["mode"] = "apend"
    raw["trigger"]["interval"] = "soon"
    text = dump(raw)
    (folder / "orders.yaml").write_text(text)
    path = folder / "orders.yaml"
    mode, interval = line_with(text, "mode: apend"), line_with(text, "interval: soon")
    expected = [f"{path}:{mode}: target.mode: 'apend' is not one of append, upsert, cdc; did you mean 'append'?",
                f"{path}:{interval}: trigger.interval: 'soon' is not a duration like 500ms, 5s, 2m, 1h or 7d"]

    found = load_specs(folder)
    assert [str(p) for p in found.errors[str(path)].problems] == expected
    with pytest.raises(BrokenSpecsError) as info:
        found.raise_errors()
    assert str(info.value).splitlines()[1:] == [f"- {line}" for line in expected]

    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(folder))
    assert cli.main(["pipelines"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {line}" for line in expected]
    assert cli.main(["ingest", "--pipeline", "orders", "--once"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {line}" for line in expected]
    assert cli.main(["pipelines", "--json"]) == 2
    listed = json.loads(capsys.readouterr().out)["errors"]
    assert [(p["line"], p["field"]) for p in listed[0]["problems"]] == [(mode, "target.mode"),
                                                                      (interval, "trigger.interval")]


# ------------------------------------------------------------------------------------ lines of values

def test_a_key_path_resolves_to_its_line_through_dotted_keys_and_named_list_items():
    document = parse_yaml("target:\n  properties:\n    write.parquet.page-size-bytes: 1\n    write: 2\n"
                          "contract:\n  fields:\n    - name: a\n      type: int\n    - {name: b, type: x}\n")
    assert document.line_of("target.properties.write.parquet.page-size-bytes") == 3
    assert document.line_of("target.properties.write") == 4
    assert document.line_of("contract.fields[a].type") == 8
    assert document.line_of("contract.fields[1].type") == 9
    assert document.line_of("contract.fields[b]") == 9
    assert document.line_of("contract.fields[c].type") == 6  # no such field: where the list is
    assert document.line_of("target.missing") == 1
    assert document.line_of("(file)") is None and document.line_of("") is None


# ---------------------------------------------------------------------------------- nothing half-read

def holds_invalid(value) -> bool:
    """Whether a check's placeholder for a refused value is anywhere in `value`."""
    if dataclasses.is_dataclass(value):
        return any(holds_invalid(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, dict):
        return any(holds_invalid(k) or holds_invalid(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(holds_invalid(v) for v in value)
    return type(value).__name__ == "Invalid"


PATHS = [("source", "partitions"), ("source", "key", "field"), ("target", "mode"), ("target", "key"),
         ("target", "partition_by"), ("target", "fanout"), ("contract", "fields"), ("contract", "from"),
         ("trigger", "interval"), ("publish", "view"), ("retention", "guard_threshold"), ("name",)]
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=12),
                   st.sampled_from(["cdc", "upsert", "order_id", ["order_id"], "day(event_time)", "writer_schema",
                                    {"field": "currency", "routes": {"EUR": "raw.orders_eur"}}, "50%", "raw.x"]),
                   st.lists(st.sampled_from(["order_id", "amount", 3, "bucket(4, order_id)"]), max_size=3))


@settings(max_examples=150, deadline=None, database=None)
@given(changes=st.lists(st.tuples(st.sampled_from(PATHS), VALUES), min_size=1, max_size=3))
def test_a_spec_loads_whole_or_every_problem_has_a_line_in_the_file(tmp_path_factory, changes):
    raw = copy.deepcopy(TEMPLATE)
    for keys, value in changes:
        here = raw
        for key in keys[:-1]:
            here = here[key]
        here[keys[-1]] = copy.deepcopy(value)
    text = dump(raw)
    path = tmp_path_factory.mktemp("half") / "orders.yaml"
    path.write_text(text)
    try:
        spec = load_spec(path)
    except SpecError as exc:
        assert exc.problems and all(p.path == str(path) and p.field and p.why for p in exc.problems)
        assert all(p.line is None or 1 <= p.line <= len(text.splitlines()) for p in exc.problems)
        assert [p.line or 0 for p in exc.problems] == sorted(p.line or 0 for p in exc.problems)
        assert len({(p.field, p.why) for p in exc.problems}) == len(exc.problems), str(exc)  # no error twice
    else:
        assert isinstance(spec, PipelineSpec) and not holds_invalid(spec)
