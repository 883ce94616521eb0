"""The benchmark's private platform: a scratch LAKEHOUSE_HOME, its own broker port and pipeline specs.

The benchmark never touches a user's stack: everything lives under one folder
(default reports/bench/stack, wiped at start), the embedded broker listens on its
own port, and the pipeline specs it generates live in their own folder. Components
are started as users start them: the `lakehouse` CLI as subprocesses, with the
environment this module builds.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lakehouse.core import config
from lakehouse.core.spec import PipelineSpec, load_spec
from lakehouse_dev.settings import read_state_file

DEFAULT_BROKER_PORT = 19192
TEMPLATE_SPEC = config.REPO_ROOT / "include" / "pipelines" / "orders.yaml"
CDC_TEMPLATE_SPEC = config.REPO_ROOT / "include" / "pipelines" / "inventory.yaml"  # mode cdc, Debezium
SCHEMA_FILE_SUFFIX = {"avro": "avsc", "protobuf": "proto", "json_schema": "json"}
# Variables that would point the benchmark at a real cluster, catalog or warehouse, or inject faults.
_FOREIGN_PREFIXES = ("LAKEHOUSE_BOOTSTRAP_SERVERS", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE",
                     "LAKEHOUSE_KAFKA_", "LAKEHOUSE_FAULT", "LAKEHOUSE_SPARK_MASTER", "LAKEHOUSE_SUPERVISED")


class BenchError(RuntimeError):
    """A benchmark step could not run; the message says which and why."""


def lakehouse_command() -> list[str]:
    """The `lakehouse` console script next to this interpreter (the venv's), else `python -m lakehouse.cli`."""
    script = Path(sys.executable).with_name("lakehouse")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lakehouse.cli"]


@dataclass
class BenchStack:
    """A scratch embedded stack: home, broker port and pipelines folder, plus the CLI to drive it."""

    home: Path
    port: int = DEFAULT_BROKER_PORT

    @property
    def pipelines_dir(self) -> Path:
        return self.home / "pipelines"

    @property
    def logs_dir(self) -> Path:
        return self.home / "bench-logs"

    def environ(self) -> dict[str, str]:
        """os.environ with the scratch stack's variables set and foreign cluster settings removed."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
        env.update({
            "LAKEHOUSE_HOME": str(self.home),
            "LAKEHOUSE_BROKER_PORT": str(self.port),
            "LAKEHOUSE_PIPELINES_DIR": str(self.pipelines_dir),
            # Spark's Python workers must run this interpreter (it has pyarrow & co.)
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONUNBUFFERED": "1",
        })
        return env

    def activate(self) -> None:
        """Point this process (in-process lakehouse calls: topics, events, offsets) at the scratch stack."""
        for name in [k for k in os.environ if k.startswith(_FOREIGN_PREFIXES)]:
            del os.environ[name]
        os.environ.update(self.environ())

    def platform(self) -> config.PlatformConfig:
        """The scratch stack's platform configuration (call after `activate`)."""
        return config.load()

    # -- the CLI ---------------------------------------------------------------------------

    def run_cli(self, *args: str, timeout: float = 600.0, log_name: str | None = None) -> subprocess.CompletedProcess:
        """Run `lakehouse ARGS` to completion, whatever its exit code; its output is also kept in the
        logs folder under `log_name`. Raises BenchError when it does not finish within `timeout`."""
        cmd = [*lakehouse_command(), *args]
        try:
            done = subprocess.run(cmd, env=self.environ(), capture_output=True, text=True, timeout=timeout,
                                  cwd=config.REPO_ROOT)
        except subprocess.TimeoutExpired as exc:
            raise BenchError(f"`lakehouse {' '.join(args)}` did not finish within {timeout:.0f}s") from exc
        if log_name:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            (self.logs_dir / f"{log_name}.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
        return done

    def cli(self, *args: str, timeout: float = 600.0, log_name: str | None = None) -> str:
        """Run `lakehouse ARGS` to completion and return its stdout.

        Raises BenchError with the end of its stderr when it exits non-zero or times out.
        """
        done = self.run_cli(*args, timeout=timeout, log_name=log_name)
        if done.returncode != 0:
            raise BenchError(f"`lakehouse {' '.join(args)}` exited with {done.returncode}: "
                             f"{tail(done.stderr or done.stdout)}")
        return done.stdout

    def broker_pid(self) -> int | None:
        """The scratch broker's process id (None when it is not running)."""
        pid = read_state_file(self.home).get("pid")
        return pid if isinstance(pid, int) else None

    def spawn(self, *args: str, log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start `lakehouse ARGS` in its own process group; stdout is piped, stderr goes to a log file.
        `env` adds to (or overrides) the stack's environment."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        stderr = open(self.logs_dir / f"{log_name}.stderr.log", "w")
        try:
            return subprocess.Popen([*lakehouse_command(), *args], env={**self.environ(), **(env or {})},
                                    stdout=subprocess.PIPE,
                                    stderr=stderr, text=True, cwd=config.REPO_ROOT, start_new_session=True)
        finally:
            stderr.close()  # the child holds its own descriptor

    def stderr_tail(self, log_name: str) -> str:
        try:
            return tail((self.logs_dir / f"{log_name}.stderr.log").read_text(errors="replace"))
        except OSError:
            return "(no stderr log)"

    # -- lifecycle -------------------------------------------------------------------------

    def up(self, *options: str) -> dict:
        """Stop a leftover stack of this home, wipe the home, start a fresh one (`lakehouse stack up
        OPTIONS`, e.g. --object-store); returns its status.

        Raises BenchError when the broker cannot start (e.g. the port is taken).
        """
        if self.home.exists():
            with contextlib.suppress(BenchError):
                self.cli("stack", "down", timeout=60)
            shutil.rmtree(self.home)
        self.home.mkdir(parents=True)
        self.pipelines_dir.mkdir()
        return json.loads(self.cli("stack", "up", *options, "--json", timeout=180))

    def down(self) -> None:
        """Stop the scratch broker (tables stay on disk for inspection until the next run wipes them)."""
        self.cli("stack", "down", timeout=60)

    # -- pipeline specs --------------------------------------------------------------------

    def write_spec(self, name: str, topic: str, partitions: int, max_records_per_batch: int,
                   trigger_interval: str = "5s", value_format: str = "json",
                   write_interval: str | None = None) -> PipelineSpec:
        """A pipeline spec derived from include/pipelines/orders.yaml (append, day(event_time), its
        contract) with its own topic and tables, written to the scratch pipelines folder. A wire
        `value_format` (avro, protobuf, json_schema) gets the contract's writer schema as schema 1 of
        its schema folder (`schemas/<name>` beside the spec), as `lakehouse produce` writes it. A
        `write_interval` writes files that often between the trigger's commits (trigger.write_interval)."""
        raw = derive_spec(yaml.safe_load(TEMPLATE_SPEC.read_text()), name, topic, partitions,
                          max_records_per_batch, trigger_interval)
        if write_interval is not None:
            raw["trigger"]["write_interval"] = write_interval
        if value_format != "json":
            from lakehouse_dev import record_formats

            contract = load_spec(TEMPLATE_SPEC).contract.fields
            folder = self.pipelines_dir / "schemas" / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"1.{SCHEMA_FILE_SUFFIX[value_format]}").write_text(
                record_formats.contract_schema(value_format, contract, name))
            raw["source"].update({"value_format": value_format, "schemas": f"schemas/{name}"})
        path = self.pipelines_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return load_spec(path)

    def write_cdc_spec(self, name: str, topic: str, partitions: int, max_records_per_batch: int,
                       value_format: str = "json") -> PipelineSpec:
        """A change-stream pipeline spec derived from include/pipelines/inventory.yaml (mode cdc, Debezium
        envelopes keyed by product_id, merge-on-read) with its own topic and tables. In Avro, the envelope's
        and the key's writer schemas (as Confluent's AvroConverter writes them) are schemas 1 and 2 of its
        schema folder."""
        from lakehouse_dev import change_streams

        template = yaml.safe_load(CDC_TEMPLATE_SPEC.read_text())
        raw = derive_spec(template, name, topic, partitions, max_records_per_batch, None)
        if value_format == "avro":
            contract = load_spec(CDC_TEMPLATE_SPEC).contract.fields
            keys = tuple(f for f in contract if f.name in template["target"]["key"])
            folder = self.pipelines_dir / "schemas" / name
            folder.mkdir(parents=True, exist_ok=True)
            prefix = f"{name}.public.{name}"
            (folder / "1.avsc").write_text(json.dumps(change_streams.connect_avro(
                change_streams.envelope_connect(contract, prefix, "precise"))))
            (folder / "2.avsc").write_text(json.dumps(change_streams.connect_avro(
                change_streams.key_connect(keys, prefix, "precise"))))
            raw["source"].update({"value_format": "avro", "schemas": f"schemas/{name}"})  # the key: the same format
        path = self.pipelines_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return load_spec(path)


def derive_spec(template: dict[str, Any], name: str, topic: str, partitions: int, max_records_per_batch: int,
                trigger_interval: str | None) -> dict[str, Any]:
    """The template spec (as YAML data) renamed to `name`, reading `topic`, writing raw.<name>(_dlq); a
    `trigger_interval` of None keeps the template's trigger (a scheduled one has none)."""
    raw = copy.deepcopy(template)
    raw["name"] = name
    raw["source"]["topic"] = topic
    raw["source"]["partitions"] = partitions
    raw["target"]["table"] = f"raw.{name}"
    raw["dead_letter"]["table"] = f"raw.{name}_dlq"
    raw.setdefault("trigger", {})["max_records_per_batch"] = max_records_per_batch
    if trigger_interval is not None:
        raw["trigger"]["interval"] = trigger_interval
    if isinstance(raw.get("publish"), dict):
        raw["publish"]["view"] = f"serve.{name}"
        raw["publish"].setdefault("suite", template.get("name"))
    return raw


def tail(text: str, lines: int = 15) -> str:
    """The last `lines` non-empty lines of `text`, indented, for error messages."""
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n    " + "\n    ".join(kept) if kept else "(no output)"


def stop_process_group(proc: subprocess.Popen, timeout: float = 60.0) -> int | None:
    """Stop a job started by `BenchStack.spawn`: SIGTERM to the `lakehouse` process only (the ingest
    job then finishes its batch in flight; its JVM must not get the signal too), SIGKILL to whatever
    is left of its process group after `timeout` seconds. Returns the job's exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers: the JVM and Python workers of a killed job
    if proc.poll() is None:
        proc.wait(timeout=10)
    return proc.returncode
