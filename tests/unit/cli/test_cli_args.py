"""Every CLI argument is checked while parsing: a bad one exits 2 naming it, before anything is created.

The CLI runs in-process (`lakehouse.cli.main`) with LAKEHOUSE_HOME in an empty folder: after a refused
command the folder is still empty (no catalog, no broker state) and no Spark session was started.
"""

import ast
import re
import shlex
from pathlib import Path

import pytest
import yaml

from lakehouse.core.config import REPO_ROOT
from lakehouse import cli

ORDERS = REPO_ROOT / "include" / "pipelines" / "orders.yaml"


@pytest.fixture
def home(own_home, monkeypatch) -> Path:
    """An empty LAKEHOUSE_HOME; the shipped specs; no metrics port from the environment."""
    monkeypatch.delenv("LAKEHOUSE_PIPELINES_DIR", raising=False)
    monkeypatch.delenv("LAKEHOUSE_METRICS_PORT", raising=False)
    return own_home


def refused(argv: list[str], capsys) -> str:
    """The error message of `lakehouse ARGV`, which must exit 2."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["ingest", "--pipeline", "orders", "--trigger-interval", "0s"], "argument --trigger-interval: '0s' must be longer"),
    (["ingest", "--pipeline", "orders", "--trigger-interval", "2d"], "argument --trigger-interval: '2d' is longer than 1d"),
    (["ingest", "--pipeline", "orders", "--trigger-interval", "nan"], "argument --trigger-interval: 'nan' is not a"),
    (["ingest", "--pipeline", "orders", "--trigger-interval", "5s\n"], "argument --trigger-interval"),
    (["ingest", "--pipeline", "orders", "--max-batches", "0"], "argument --max-batches: '0' is out of range"),
    (["ingest", "--pipeline", "orders", "--metrics-port", "70000"], "argument --metrics-port: '70000' is out of range"),
    (["ingest", "--pipeline", "orders\n", "--once"], "argument --pipeline: 'orders\\n' is not a pipeline name"),
    (["ingest", "--pipeline", "Orders", "--once"], "argument --pipeline: 'Orders' is not a pipeline name"),
    (["produce", "--pipeline", "orders", "--count", "-1"], "argument --count: '-1' is out of range"),
    (["produce", "--pipeline", "orders", "--count", "1e3"], "argument --count: '1e3' is not an integer"),
    (["produce", "--pipeline", "orders", "--count", "5", "--rate", "0"], "argument --rate: '0' is out of range"),
    (["produce", "--pipeline", "orders", "--count", "5", "--rate", "inf"], "argument --rate: 'inf' is out of range"),
    (["produce", "--pipeline", "orders", "--count", "5", "--bad-ratio", "1.5"], "argument --bad-ratio: '1.5'"),
    (["produce", "--pipeline", "orders", "--count", "5", "--bad-ratio", "nan"], "argument --bad-ratio: 'nan'"),
    (["replay", "--pipeline", "orders", "--offsets", "0:200-100"], "argument --offsets: offset range '0:200-100'"),
    (["replay", "--pipeline", "orders", "--offsets", ""], "argument --offsets: no offset ranges given"),
    (["replay", "--pipeline", "orders", "--offsets", "0:1-2", "--into-table", "raw.orders\n"],
     "argument --into-table: 'raw.orders\\n' is not a table name"),
    (["replay", "--pipeline", "orders", "--offsets", "0:1-2", "--into-table", "raw.x; drop table raw.orders"],
     "argument --into-table"),
    (["replay", "--pipeline", "orders", "--from-time", "yesterday"],
     "argument --from-time: 'yesterday' is neither an ISO-8601 time (2026-11-21T10:00:00Z) nor a duration ago"),
    (["replay", "--pipeline", "orders", "--from-time", "2026-11-21T10:00:00Z", "--to-time", "2026-11-21T09:00:00Z"],
     "argument --to-time: must be later than --from-time"),
    (["replay", "--pipeline", "orders", "--offsets", "0:1-2", "--to-time", "2026-11-21T09:00:00Z"],
     "argument --to-time: needs --from-time"),
    (["replay", "--pipeline", "orders", "--dead-letters", "--error-kind", "gremlins"],
     "argument --error-kind: 'gremlins' is not an error kind"),
    (["replay", "--pipeline", "orders", "--offsets", "0:1-2", "--error-kind", "bad_enum"],
     "argument --error-kind: only applies with --dead-letters"),
    (["replay", "--pipeline", "orders", "--dead-letters", "--into-table", "raw.x"],
     "argument --into-table: replays offsets or a time range"),
    (["stack", "up", "--port", "0"], "argument --port: '0' is out of range"),
    (["stack", "up", "--spark-port", "65536"], "argument --spark-port: '65536' is out of range"),
    (["stack", "up", "--spark-ui-port", "http"], "argument --spark-ui-port: 'http' is not an integer"),
    (["airflow", "up", "--port", "-8080"], "argument --port: '-8080' is out of range"),
    (["status", "--pipeline", "raw.orders"], "argument --pipeline: 'raw.orders' is not a pipeline name"),
])
def test_a_bad_argument_exits_2_naming_it_and_creates_nothing(home, capsys, argv, message):
    assert message in refused(argv, capsys)
    assert list(home.iterdir()) == []
    # nor a Spark session: in the unit layer starting one fails the test (conftest.unit_layer_guard)


def test_a_bad_metrics_port_in_the_environment_is_refused_by_ingest_only(home, capsys, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_METRICS_PORT", "abc")
    assert "LAKEHOUSE_METRICS_PORT: 'abc' is not an integer" in refused(
        ["ingest", "--pipeline", "orders", "--trigger-interval", "1s"], capsys)
    assert cli.main(["pipelines"]) == 0
    assert list(home.iterdir()) == []


def test_good_arguments_arrive_parsed(monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_METRICS_PORT", "9108")
    ingest = cli.parse_args(["ingest", "--pipeline", "orders", "--trigger-interval", "500ms", "--max-batches", "3"])
    assert (ingest.trigger_interval, ingest.max_batches, ingest.metrics_port) == (0.5, 3, 9108)
    replay = cli.parse_args(["replay", "--pipeline", "orders", "--offsets", "0:100-200,2:0-50",
                             "--into-table", "raw.orders_rebuilt"])
    assert (replay.offsets, replay.into_table) == ({0: (100, 200), 2: (0, 50)}, "raw.orders_rebuilt")
    window = cli.parse_args(["replay", "--pipeline", "orders", "--from-time", "2026-11-21T10:00:00Z",
                             "--to-time", "2026-11-21T10:00:01+00:00"])
    assert window.to_time - window.from_time == 1000
    produce = cli.parse_args(["produce", "--pipeline", "orders", "--count", "0", "--rate", "0.5",
                              "--bad-ratio", "1", "--seed", "-7"])
    assert (produce.count, produce.rate, produce.bad_ratio, produce.seed) == (0, 0.5, 1.0, -7)


def test_pipelines_lists_the_valid_specs_reports_broken_files_and_exits_2(home, tmp_path, capsys, monkeypatch):
    specs = tmp_path / "pipelines"
    specs.mkdir()
    (specs / "orders.yaml").write_text(ORDERS.read_text())
    (specs / "broken.yaml").write_text(ORDERS.read_text().replace("mode: append", "mode: sideways")
                                       .replace("name: orders", "name: broken"))
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(specs))

    assert cli.main(["pipelines"]) == 2
    out, err = capsys.readouterr()
    header, row = out.splitlines()  # a table: the header, then one row per valid spec
    assert header.split() == ["PIPELINE", "TOPIC", "TABLES", "MODE", "DEAD", "LETTERS"]
    assert row.split()[0] == "orders" and "broken" not in out
    assert err == f"error: {specs / 'broken.yaml'}:16: target.mode: 'sideways' is not one of append, upsert, cdc\n"

    assert cli.main(["pipelines", "--json"]) == 2
    listed = yaml.safe_load(capsys.readouterr().out)
    assert [p["name"] for p in listed["pipelines"]] == ["orders"]
    assert [(e["pipeline"], e["line"], e["field"]) for e in listed["errors"]] == [("broken", 16, "target.mode")]
    assert listed["errors"][0]["problems"] == [{"line": 16, "field": "target.mode",
                                                "why": "'sideways' is not one of append, upsert, cdc"}]

    (specs / "broken.yaml").unlink()
    assert cli.main(["pipelines"]) == 0
    assert list(home.iterdir()) == []


# ---------------------------------------------------------------------------- the commands messages suggest

REPO = REPO_ROOT
# where the product and its development stack write messages for people
MESSAGE_SOURCES = ("include/lakehouse", "providers/lakehouse", "plugins", "dags", "spark_jobs", "devstack/lakehouse_dev",
                   "scripts")
SUGGESTED = re.compile(r"`lakehouse ([^`]*)`")
# what a message's placeholders stand for when its command is parsed: pipeline names, offsets, durations
PLACEHOLDERS = {"NAME": "orders", "P:START-END": "0:1-2", "DURATION": "1h", "FROM..TO": "1..2", "N": "1"}


def _message_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string a module builds that is not a docstring: its f-strings with every
    replacement field as `{}`, adjacent literals joined as Python joins them."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    docstrings |= parts  # an f-string's literal parts are read with it
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                           for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        else:
            continue
        found.append((node.lineno, text))
    return found


def _argv(command: str) -> list[str]:
    """A suggested command's arguments, each placeholder given a value of its kind: a pipeline's name, else
    numbers that grow from field to field (so `{offset}-{offset + 1}` is a range)."""
    command = re.sub(r"\{[^}]*(name|pipeline)[^}]*\}", "orders", command)
    numbers = iter(range(1, 100))
    command = re.sub(r"\{[^}]*\}", lambda _: str(next(numbers)), command)
    return [PLACEHOLDERS.get(word, word) for word in shlex.split(command)]


def suggested_commands() -> list[tuple[str, str]]:
    """(where, command) of every `lakehouse ...` command a message of the product suggests."""
    found = []
    for folder in MESSAGE_SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            for line, text in _message_texts(path):
                found += [(f"{path.relative_to(REPO)}:{line}", m.group(1)) for m in SUGGESTED.finditer(text)]
    return found


def test_messages_suggest_commands_the_cli_accepts():
    """Every `lakehouse ...` a message tells people to run parses: its subcommand and options exist."""
    commands = suggested_commands()
    assert len(commands) >= 15, commands  # the walk finds the messages
    parser = cli.build_parser()
    refused_ = []
    for where, command in commands:
        try:
            parser.parse_args(_argv(command))
        except SystemExit:
            refused_.append(f"{where}: `lakehouse {command}`")
    assert not refused_, "messages suggest commands the CLI refuses:\n" + "\n".join(refused_)
