"""Spark's local files (spark.local.dir) live in a folder each process claims under the stack's home, and the
folders of processes that ended, however they ended, are removed: a killed driver's copy of the
spark.jars.packages jars (~120 MB) must not pile up in /tmp with every restart.

The processes here are real ones holding real locks; no Spark is started (the e2e kill -9 chain checks a real
driver's leftovers: test_exactly_once).
"""

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from lakehouse.core import config, sparkenv

CLAIM = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from lakehouse.core import config, sparkenv
    folder = sparkenv.scratch_dir(config.load(fresh=True))
    (folder / "userFiles-x").mkdir()
    (folder / "userFiles-x" / "iceberg-spark-runtime.jar").write_bytes(b"0" * 4096)
    print(folder, flush=True)
    time.sleep(600)
""")


@pytest.fixture
def home(own_home):
    return own_home


def platform_of(home):
    return dataclasses.replace(config.load(fresh=True), home=home)


def start_claimer():
    """A process that claims its folder, puts a file in it, and lives on until killed."""
    child = subprocess.Popen([sys.executable, "-c", CLAIM], stdout=subprocess.PIPE, text=True)
    folder = child.stdout.readline().strip()
    assert folder, "the claiming process printed no folder"
    return child, folder


def folders(home):
    return sorted(p for p in (home / "spark-local").iterdir() if not p.name.endswith(".lock"))


def test_a_killed_process_folder_is_removed_by_the_next_claim_and_a_live_one_is_kept(home):
    killed, killed_folder = start_claimer()
    alive, alive_folder = start_claimer()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert os.path.exists(os.path.join(killed_folder, "userFiles-x", "iceberg-spark-runtime.jar"))

        mine = sparkenv.scratch_dir(platform_of(home))

        assert [str(p) for p in folders(home)] == sorted([alive_folder, str(mine)])
        assert not os.path.exists(killed_folder + ".lock")
        assert os.path.exists(os.path.join(alive_folder, "userFiles-x", "iceberg-spark-runtime.jar"))
    finally:
        alive.kill()
        alive.wait()
    # the next session of this process sweeps again: the process that ended since is gone too
    assert sparkenv.scratch_dir(platform_of(home)) == mine
    assert folders(home) == [mine]


def test_a_folder_without_its_lock_and_a_lock_without_its_folder_are_both_stale(home):
    root = home / "spark-local"
    root.mkdir()
    (root / "123-lockless").mkdir()
    (root / "123-lockless" / "blockmgr-1").mkdir()
    (root / "456-folderless.lock").touch()
    (root / "not-a-folder").write_text("left as it is")

    mine = sparkenv.scratch_dir(platform_of(home))

    assert sorted(p.name for p in root.iterdir()) == sorted([mine.name, mine.name + ".lock", "not-a-folder"])


def test_a_symlink_in_the_root_is_never_followed(home, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("kept")
    root = home / "spark-local"
    root.mkdir()
    (root / "789-link").symlink_to(outside, target_is_directory=True)

    sparkenv.scratch_dir(platform_of(home))

    assert (outside / "precious").read_text() == "kept"


def test_the_users_own_local_folders_win(home, monkeypatch):
    chosen = dataclasses.replace(platform_of(home), spark_conf={"spark.local.dir": "/data/spark"})
    assert sparkenv.scratch_dir(chosen) is None
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/data/spark")
    assert sparkenv.scratch_dir(platform_of(home)) is None
    assert not (home / "spark-local").exists()


def test_a_home_it_cannot_write_leaves_sparks_default_with_a_warning(home, capsys):
    home.mkdir(parents=True, exist_ok=True)
    (home / "spark-local").write_text("a file where the folder should be")

    assert sparkenv.scratch_dir(platform_of(home)) is None
    assert "Spark's local files stay in its default folder" in capsys.readouterr().err
