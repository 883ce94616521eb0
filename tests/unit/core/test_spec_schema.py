"""The JSON Schema editors read (docs/spec.schema.json) is the one the code builds from the vocabulary the
parser checks with: it knows every key the parser takes and refuses the ones the parser refuses, and
every spec the platform loads is valid under it."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse.core.config import REPO_ROOT
from lakehouse import cli
from lakehouse.core.spec import SpecError, load_spec
from lakehouse.core.spec_schema import spec_json_schema
from lakehouse.core.vocabulary import SECTION_KEYS

REPO = REPO_ROOT
SCHEMA_FILE = REPO / "docs" / "spec.schema.json"
PIPELINES = REPO / "include" / "pipelines"
TEMPLATE = yaml.safe_load((PIPELINES / "orders.yaml").read_text())
VALIDATOR = jsonschema.Draft7Validator(spec_json_schema())


def test_the_schema_file_is_the_one_the_code_builds():
    """docs/spec.schema.json is regenerated with `lakehouse pipelines --schema > docs/spec.schema.json`."""
    jsonschema.Draft7Validator.check_schema(spec_json_schema())
    assert json.loads(SCHEMA_FILE.read_text()) == spec_json_schema(), \
        "docs/spec.schema.json is stale: run `lakehouse pipelines --schema > docs/spec.schema.json`"


def test_lakehouse_pipelines_schema_prints_it(capsys):
    assert cli.main(["pipelines", "--schema"]) == 0
    assert json.loads(capsys.readouterr().out) == spec_json_schema()


@pytest.mark.parametrize("path", sorted(PIPELINES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_spec_is_valid_under_the_schema(path):
    assert [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))] == []


def _section(schema: dict, section: str) -> dict:
    """The schema of a section's mapping ("" the top level, "source.key" the key under source)."""
    here = schema
    for part in filter(None, section.split(".")):
        prop = here["properties"][part]
        prop = prop["anyOf"][0] if "anyOf" in prop else prop  # a section that may be left empty
        here = schema["definitions"][prop["$ref"].rsplit("/", 1)[1]]
    return here


@pytest.mark.parametrize("section", sorted(SECTION_KEYS))
def test_each_section_lists_exactly_the_keys_the_parser_takes_and_no_other(section):
    schema = _section(spec_json_schema(), section)
    assert list(schema["properties"]) == list(SECTION_KEYS[section])
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("keys, value", [
    (("trigger", "intervall"), "5s"),
    (("target", "mode"), "apend"),
    (("source", "partitions"), 0),
    (("contract", "fields", 0, "type"), "strng"),
    (("target", "table"), "Raw.Orders"),
    (("maintenance", "schedule"), "@hourlly"),
    (("target", "properties", "write.data.path"), "/elsewhere"),
])
def test_a_mistake_both_refuse(tmp_path, keys, value):
    raw = copy.deepcopy(TEMPLATE)
    here = raw
    for key in keys[:-1]:
        here = here.setdefault(key, {}) if isinstance(key, str) else here[key]
    here[keys[-1]] = value
    assert list(VALIDATOR.iter_errors(raw)), "the schema takes it"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError):
        load_spec(path)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 10 ** 6), st.floats(allow_nan=False),
                    st.sampled_from(["5s", "90m", "@daily", "*/5 * * * *", "upsert", "cdc", "evolve", "quarantine",
                                     "scheduled", "raw.orders_x", "serve.x", "50%", "3d", "order_id", "avro"]))
PLACES = [("trigger", "interval"), ("trigger", "mode"), ("trigger", "schedule"), ("slo", "freshness"),
          ("slo", "lag_records"), ("target", "mode"), ("target", "key"), ("target", "target_file_size_mb"),
          ("source", "partitions"), ("source", "retention_ms"), ("publish", "view"), ("publish", "schedule"),
          ("retention", "guard_threshold"), ("retention", "delete_after"), ("schema_policy", "on_incompatible"),
          ("supervision", "max_restarts"), ("maintenance", "min_input_files"), ("verify", "schedule")]


@settings(max_examples=150, deadline=None, database=None)
@given(changes=st.lists(st.tuples(st.sampled_from(PLACES), SCALARS), max_size=3))
def test_every_spec_the_platform_loads_is_valid_under_the_schema(tmp_path_factory, changes):
    raw = copy.deepcopy(TEMPLATE)
    for (section, key), value in changes:
        raw.setdefault(section, {})[key] = value
    path = tmp_path_factory.mktemp("schema") / "orders.yaml"
    path.write_text(yaml.safe_dump(raw))
    try:
        load_spec(path)
    except SpecError:
        return
    assert [e.message for e in VALIDATOR.iter_errors(raw)] == []
