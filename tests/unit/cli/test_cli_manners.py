"""The command line behaves as users of other data tools' CLIs expect (docs/cli.md):

- every subcommand and every option says what it is for in `--help`;
- `lakehouse --version` prints the installed distribution's version and exits 0;
- shell completion (argcomplete) offers the pipelines of the configured specs folder for `--pipeline`;
- every duration option takes exactly what a spec takes for the same setting, and every point-in-time option
  exactly what `lakehouse.core.spec.parse_moment` takes (ISO-8601 or a duration ago), refusing the rest with
  the same words, before anything runs.

All in-process (`lakehouse.cli`), in the unit layer; tests/e2e/test_cli_pipes.py runs the console script itself.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tomllib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import argcomplete
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lakehouse.core.config import REPO_ROOT
from lakehouse import cli
from lakehouse.core.spec import SpecError, load_spec, parse_moment

REPO = REPO_ROOT
ORDERS = REPO / "include" / "pipelines" / "orders.yaml"
EXAMPLES = settings(max_examples=150, deadline=None, database=None)


def refused(argv: list[str]) -> str:
    """The error output of `lakehouse ARGV`, which must exit 2 while parsing."""
    err = io.StringIO()
    with pytest.raises(SystemExit) as info, contextlib.redirect_stderr(err):
        cli.parse_args(argv)
    assert info.value.code == 2
    return err.getvalue()


# ---------------------------------------------------------------------------- help

def _arguments(parser: argparse.ArgumentParser, path: str):
    """(where, what, help) of every subcommand and every argument under `parser`, however deep."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                yield path, f"subcommand {name}", helps.get(name)
                yield from _arguments(subparser, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, "/".join(action.option_strings) or action.dest, action.help


def test_every_subcommand_and_option_says_what_it_is_for():
    found = list(_arguments(cli.build_parser(), "lakehouse"))
    assert len(found) > 80  # the walk reaches every subcommand's options, the development stack's too
    silent = [f"{where}: {what}" for where, what, help in found if not (help or "").strip()]
    assert not silent, "arguments without help:\n" + "\n".join(silent)
    assert ("lakehouse status", "--pipeline") in {(where, what) for where, what, _ in found}


def test_help_of_a_subcommand_explains_pipeline(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["ingest", "--help"])
    assert info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--pipeline PIPELINE the pipeline, by the `name` its spec declares" in shown


# ---------------------------------------------------------------------------- --version

def test_version_is_the_installed_distributions_and_exits_0(capsys):
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"lakehouse {declared['version']}\n"
    assert declared["name"] == cli.DISTRIBUTION


# ---------------------------------------------------------------------------- completion

@pytest.fixture
def specs_folder(tmp_path, monkeypatch) -> Path:
    """A specs folder with pipelines orders, orders_eu and payments_x (the last one broken) as
    LAKEHOUSE_PIPELINES_DIR."""
    folder = tmp_path / "pipelines"
    folder.mkdir()
    template = yaml.safe_load(ORDERS.read_text())
    for name, mode in (("orders", "append"), ("orders_eu", "append"), ("payments_x", "sideways")):
        raw = {**template, "name": name, "source": {**template["source"], "topic": f"t-{name}"},
               "target": {**template["target"], "table": f"raw.{name}", "mode": mode},
               "dead_letter": {"table": f"raw.{name}_dlq"}, "publish": {**template["publish"], "view": f"serve.{name}"}}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(folder))
    return folder


class InProcessFinder(argcomplete.CompletionFinder):
    """argcomplete's finder, its debug output kept in memory: the shell's file descriptor 9 is pytest's here."""

    def _init_debug_stream(self):
        argcomplete.io.debug_stream = io.StringIO()


def _exit(code: int):
    raise SystemExit(code)


def complete(line: str, monkeypatch) -> list[str]:
    """What argcomplete offers for the command line `line` (cursor at its end), asked as a shell asks."""
    out = io.StringIO()
    with monkeypatch.context() as shell:
        for name, value in {"_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
                            "_ARGCOMPLETE_IFS": "\n"}.items():
            shell.setenv(name, value)
        with pytest.raises(SystemExit) as info:
            InProcessFinder()(cli.build_parser(), exit_method=_exit, output_stream=out)
    assert info.value.code == 0
    return sorted(word.strip() for word in out.getvalue().split("\n") if word.strip())


def test_completion_offers_the_pipelines_of_the_specs_folder(specs_folder, monkeypatch):
    # a broken file's pipeline too: `lakehouse check --pipeline payments_x` is how one finds out why
    assert complete("lakehouse status --pipeline ", monkeypatch) == ["orders", "orders_eu", "payments_x"]
    assert complete("lakehouse ingest --pipeline orders_", monkeypatch) == ["orders_eu"]
    assert complete("lakehouse produce --pipeline pay", monkeypatch) == ["payments_x"]  # the dev stack's command
    assert complete("lakehouse ch", monkeypatch) == ["check"]
    (specs_folder / "orders_eu.yaml").unlink()
    assert complete("lakehouse check --pipeline ", monkeypatch) == ["orders", "payments_x"]


def test_completion_of_a_missing_specs_folder_offers_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(tmp_path / "nowhere"))
    assert complete("lakehouse status --pipeline ", monkeypatch) == []


def test_the_module_carries_the_marker_argcomplete_looks_for():
    # register-python-argcomplete's wrapper completes a console script only when the marker is in the first
    # 1024 bytes of its module
    assert b"PYTHON_ARGCOMPLETE_OK" in (REPO / "include" / "lakehouse" / "cli.py").read_bytes()[:1024]


# ---------------------------------------------------------------------------- one duration type

def _spec_interval(text: str, folder: Path) -> float | str:
    """A spec's trigger.interval written as `text` (a YAML string): its seconds, or the SpecError's reason."""
    raw = yaml.safe_load(ORDERS.read_text())
    raw["trigger"]["interval"] = text
    raw["maintenance"]["orphan_safety_window"] = "200d"  # at least 100 intervals of up to 1d: no other field objects
    path = folder / "orders.yaml"
    path.write_text(yaml.safe_dump(raw))
    try:
        return load_spec(path).trigger.interval_s
    except SpecError as exc:
        assert exc.field == "trigger.interval", exc
        return exc.why


NUMBERS = st.one_of(st.integers(0, 10 ** 6).map(str), st.floats(0, 1e6, allow_nan=False).map(lambda f: f"{f:.3f}"),
                    st.sampled_from(["1e3", "inf", "nan", "-5", "0", "00", "99999999999999999999999", "５", "1_0"]))
DURATIONS = st.one_of(
    st.builds(lambda n, space, unit: f"{n}{space}{unit}", NUMBERS, st.sampled_from(["", " ", "  ", "\t"]),
              st.sampled_from(["ms", "s", "m", "h", "d", "w", "S", "sec", ""])),
    st.text(max_size=12),
)


@EXAMPLES
@given(text=DURATIONS)
@example(text='5s')
@example(text='500ms')
@example(text='0s')
@example(text='2d')
@example(text='5')
@example(text='5s\n')
@example(text='1d')
@example(text='86400.001s')
def test_a_duration_option_takes_what_the_spec_takes_for_the_same_setting(text, tmp_path_factory):
    expected = _spec_interval(text, tmp_path_factory.mktemp("spec"))
    argv = ["ingest", "--pipeline", "orders", f"--trigger-interval={text}"]
    if isinstance(expected, float):
        assert cli.parse_args(argv).trigger_interval == expected
    else:
        assert refused(argv).endswith(f"argument --trigger-interval: {expected}\n")


# ---------------------------------------------------------------------------- one instant type

ISO_TIMES = st.builds(
    lambda moment, zone, sep: moment.replace(tzinfo=zone).isoformat(sep=sep),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.sampled_from([None, timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]),
    st.sampled_from(["T", " "]),
)
INSTANTS = st.one_of(ISO_TIMES, ISO_TIMES.map(lambda t: t.replace("+00:00", "Z")),
                     ISO_TIMES.map(lambda t: t + " "), DURATIONS, st.text(max_size=25))
# each point-in-time option: where its value lands, as seconds since the epoch, and whether it must be past
INSTANT_OPTIONS = {
    "--from-time": (["replay", "--pipeline", "orders"], lambda a: a.from_time / 1000, False),
    # a key's window ends now unless --until says otherwise (a later since is refused: test_verify)
    "--since": (["trace", "--pipeline", "orders", "--key", "k", "--until=9999-12-31T00:00:00"],
                lambda a: a.since.timestamp(), False),
    "verify --since": (["verify", "--pipeline", "orders"], None, True),
}


@EXAMPLES
@given(text=INSTANTS, option=st.sampled_from(sorted(INSTANT_OPTIONS)))
@example(text='2h', option='--from-time')
@example(text='2026-11-21T10:00:00Z', option='verify --since')
@example(text='2026-11-21 10:00:00', option='--since')
@example(text='yesterday', option='--since')
@example(text='0s', option='verify --since')
@example(text='9999-12-30T00:00:00', option='verify --since')
@example(text='3000d', option='--from-time')
def test_every_point_in_time_option_takes_what_parse_moment_takes(text, option):
    command, landed, past = INSTANT_OPTIONS[option]
    flag = option.split()[-1]
    now = datetime.now(timezone.utc)
    try:
        moment = parse_moment(text, now)
    except ValueError as exc:
        assert refused([*command, f"{flag}={text}"]).endswith(f"argument {flag}: {exc}\n")
        return
    if past and not moment < now:
        assert "is not in the past: give an earlier ISO-8601 time or a duration ago" in refused(
            [*command, f"{flag}={text}"])
        return
    args = cli.parse_args([*command, f"{flag}={text}"])
    if landed is None:  # verify --since: the seconds from that moment to now
        assert args.since == pytest.approx((now - moment).total_seconds(), abs=5.0)
    else:  # a duration ago is measured from the moment of parsing: a few seconds later at most
        assert landed(args) == pytest.approx(moment.timestamp(), abs=5.0)


def test_the_end_of_a_window_takes_the_same_forms_as_its_start():
    window = cli.parse_args(["replay", "--pipeline", "orders", "--from-time", "3h", "--to-time", "1h"])
    assert window.to_time - window.from_time == pytest.approx(2 * 3600 * 1000, abs=2000)
    traced = cli.parse_args(["trace", "--pipeline", "orders", "--key", "k", "--since", "2026-11-21T10:00:00+01:00",
                             "--until", "30m"])
    assert traced.since == datetime(2026, 11, 21, 9, tzinfo=timezone.utc)
    assert 1795 <= (datetime.now(timezone.utc) - traced.until).total_seconds() <= 1805


def test_an_instant_option_names_both_forms_when_refusing(capsys):
    err = refused(["replay", "--pipeline", "orders", "--from-time", "last tuesday"])
    assert err.endswith("argument --from-time: 'last tuesday' is neither an ISO-8601 time (2026-11-21T10:00:00Z) "
                        "nor a duration ago (30m, 2h, 7d)\n")
