"""The installed `lakehouse` command among other Unix tools: piped into a reader that stops early it ends
quietly (no traceback, no error line: exit 141, as a tool killed by SIGPIPE), and a shell's completion
request (argcomplete's protocol) is answered with the configured specs folder's pipelines.

End-to-end layer: each test runs the console script (no broker, no Spark).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from e2e import LAKEHOUSE
from lakehouse.core.config import REPO_ROOT

pytestmark = pytest.mark.slow

ORDERS = REPO_ROOT / "include" / "pipelines" / "orders.yaml"


def write_specs(folder: Path, count: int) -> None:
    template = yaml.safe_load(ORDERS.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        name = f"p{i:03d}"
        raw = {**template, "name": name, "source": {**template["source"], "topic": f"t-{name}"},
               "target": {**template["target"], "table": f"raw.{name}"}, "dead_letter": {"table": f"raw.{name}_dlq"},
               "publish": {**template["publish"], "view": f"serve.{name}"}}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(raw))


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path, own_home):
    # 150 pipelines in a deep folder: about 0.5 MB of JSON, far more than a pipe holds, so the command is still
    # writing when `head` has read its line and gone
    folder = tmp_path
    for level in range(14):
        folder = folder / (f"d{level:02d}" + "x" * 240)
    write_specs(folder, 150)
    env = {**os.environ, "LAKEHOUSE_PIPELINES_DIR": str(folder)}

    command = subprocess.Popen([LAKEHOUSE, "pipelines", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env)
    head = subprocess.Popen(["head", "-1"], stdin=command.stdout, stdout=subprocess.PIPE)
    command.stdout.close()  # head alone reads the pipe: when it exits, nobody does
    first, _ = head.communicate(timeout=120)
    err = command.stderr.read().decode()
    command.stderr.close()
    code = command.wait(timeout=120)

    assert first == b"{\n"
    assert err == "", err  # no traceback, no "error: BrokenPipeError", no "Exception ignored"
    assert code == 141  # 128 + SIGPIPE, as a shell reports a tool the signal ended

    whole = subprocess.run([LAKEHOUSE, "pipelines", "--json"], capture_output=True, env=env, timeout=120)
    assert whole.returncode == 0 and len(whole.stdout) > 256 * 1024  # the same command, read to the end


def test_a_shells_completion_request_gets_the_pipelines_of_the_specs_folder(tmp_path, own_home):
    write_specs(tmp_path / "pipelines", 3)
    answer = tmp_path / "completions"
    line = "lakehouse replay --pipeline p00"
    env = {**os.environ, "LAKEHOUSE_PIPELINES_DIR": str(tmp_path / "pipelines"), "_ARGCOMPLETE": "1",
           "COMP_LINE": line, "COMP_POINT": str(len(line)), "_ARGCOMPLETE_IFS": "\n",
           "_ARGCOMPLETE_STDOUT_FILENAME": str(answer)}

    done = subprocess.run([LAKEHOUSE], env=env, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    assert sorted(word.strip() for word in answer.read_text().split("\n")) == ["p000", "p001", "p002"]
    # what docs/cli.md tells people to put in their shell: argcomplete's hook for the command
    hook = subprocess.run([str(Path(LAKEHOUSE).with_name("register-python-argcomplete")), "lakehouse"],
                          capture_output=True, text=True, timeout=60)
    assert hook.returncode == 0 and "complete" in hook.stdout and "lakehouse" in hook.stdout
