"""Spark's Python workers are forked from a daemon that imported the reader's modules once
(`spark.python.daemon.module` = lakehouse.core.python_daemon): each worker starts with pyarrow, pyiceberg and
the reader imported and their objects frozen out of the cyclic GC's way, instead of importing them itself.

Unit layer: what the daemon imports before it forks, and the property that names it (the user's own wins).
The end-to-end half (a task's worker is such a fork) is tests/e2e/test_python_daemon_e2e.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lakehouse.core import config, python_daemon, sparkenv


def _preloaded_in_a_fresh_interpreter(modules: tuple[str, ...]) -> dict:
    code = ("import gc, json, sys; from lakehouse.core import python_daemon; "
            f"python_daemon.preload({modules!r}); "
            f"print(json.dumps({{'imported': [m for m in {modules!r} if m in sys.modules], "
            "'frozen': gc.get_freeze_count()}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_daemon_imports_what_a_reader_task_needs_and_freezes_it_before_forking():
    found = _preloaded_in_a_fresh_interpreter(python_daemon.PRELOADED)
    assert found["imported"] == list(python_daemon.PRELOADED)
    assert "lakehouse.ingest.taskwriter" in found["imported"] and "pyiceberg.io.pyarrow" in found["imported"]
    assert found["frozen"] > 10_000  # the modules' objects: out of every forked worker's collections


def test_a_module_the_daemon_cannot_import_is_left_to_the_task_that_needs_it():
    # colorsys: a module nothing imports at start-up, so only preload() can have imported it, after the failure
    found = _preloaded_in_a_fresh_interpreter(("lakehouse.no_such_module", "colorsys"))
    assert found["imported"] == ["colorsys"]  # the daemon starts anyway; the task's own import says why it fails


def test_spark_forks_its_python_workers_from_the_lakehouse_daemon_unless_the_user_says_otherwise(monkeypatch,
                                                                                                tmp_path):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    monkeypatch.delenv("LAKEHOUSE_SPARK_CONF", raising=False)
    conf = sparkenv.spark_conf(config.load(fresh=True), ["lake"], "app")
    assert conf["spark.python.daemon.module"] == "lakehouse.core.python_daemon"
    monkeypatch.setenv("LAKEHOUSE_SPARK_CONF", '{"spark.python.daemon.module": "pyspark.daemon"}')
    conf = sparkenv.spark_conf(config.load(fresh=True), ["lake"], "app")
    assert conf["spark.python.daemon.module"] == "pyspark.daemon"  # PySpark's own, when a cluster wants it


_ZIP_PROBE = """
import importlib, json, sys, zipfile, zipimport
from lakehouse.core import python_daemon, sparkenv

def archive(path, package):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{package}/__init__.py", "")
        z.writestr(f"{package}/sub/__init__.py", "VALUE = 42")
    sys.path.insert(0, path)
    return path

def directories():
    return {path: zipimport._zip_directory_cache[path] for path in (first, later)}

first = archive(sys.argv[1] + "/first.zip", "zipped_first")
import zipped_first  # imported from a zip on sys.path before the archives are made steady
if sys.argv[2] == "daemon":
    python_daemon.preload(())  # before the daemon forks a worker
else:
    sparkenv.steady_zip_imports()  # at a task's start, under PySpark's own daemon
import zipped_first.sub  # a package folder inside the archive: a zip importer made afterwards
later = archive(sys.argv[1] + "/later.zip", "zipped_later")  # an archive shipped afterwards (addPyFile)
import zipped_later.sub
read = directories()
importlib.invalidate_caches()  # what PySpark's worker calls at each task's start
print(json.dumps({
    "reread": sorted(path.rsplit("/", 1)[1] for path, found in directories().items() if found is not read[path]),
    "values": [zipped_first.sub.VALUE, zipped_later.sub.VALUE]}))
"""


@pytest.mark.parametrize("made_steady_by", ["daemon", "task"])
def test_the_zip_archives_of_a_worker_are_read_once_not_again_at_each_task(tmp_path, made_steady_by):
    # PySpark's worker invalidates the import caches at each task's start; a zip importer then re-reads its
    # archive (pyspark.zip: 0.2-0.4 s), also those a task made for the packages it imported from a zip
    done = subprocess.run([sys.executable, "-c", _ZIP_PROBE, str(tmp_path), made_steady_by], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["reread"] == []  # neither the archive read before nor the one shipped after
    assert found["values"] == [42, 42]  # imports from the archives, old and new, still work
