"""The two test layers are checked (tests/conftest.py): a test that is not marked slow (the unit layer)
cannot start a Spark session, the embedded stack, Airflow or a `lakehouse` process, nor ask for the
fixtures that start them. These tests are themselves in the unit layer, so each refusal is real."""

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest
from e2e import LAKEHOUSE
from lakehouse.core import config, sparkenv
from lakehouse_dev import airflow_stack
from lakehouse_dev import stack as stack_module

REFUSED = r"test_layers.py::\S+ is in the unit layer \(not marked slow\) but starts "


def test_a_unit_test_cannot_start_a_spark_session():
    from pyspark.sql import SparkSession

    with pytest.raises(pytest.fail.Exception, match=REFUSED + "a Spark session"):
        SparkSession.builder.appName("unit-layer").getOrCreate()
    with pytest.raises(pytest.fail.Exception, match=REFUSED + "a Spark session"):
        sparkenv.session(config.load(), ["lake"], "unit-layer")


def test_a_unit_test_cannot_start_the_embedded_stack_or_airflow():
    with pytest.raises(pytest.fail.Exception, match=REFUSED + r"the embedded stack"):
        stack_module.up()
    with pytest.raises(pytest.fail.Exception, match=REFUSED + r"Airflow"):
        airflow_stack.up()


def test_a_unit_test_cannot_start_a_lakehouse_process_but_may_start_others():
    with pytest.raises(pytest.fail.Exception, match=REFUSED + "a `lakehouse` process"):
        subprocess.run([LAKEHOUSE, "ingest", "--pipeline", "orders", "--once"], capture_output=True)
    assert subprocess.run(["true"]).returncode == 0


def _item(slow: bool, *fixtures: str, path: Path = conftest.UNIT / "core" / "test_x.py") -> SimpleNamespace:
    return SimpleNamespace(nodeid=f"{path.relative_to(conftest.TESTS.parent)}::test_x", fixturenames=list(fixtures),
                           path=path, get_closest_marker=lambda name: object() if slow and name == "slow" else None)


def test_a_unit_test_asking_for_an_end_to_end_fixture_fails_before_its_set_up():
    with pytest.raises(pytest.fail.Exception, match=r"test_x is in the unit layer .* starts the embedded broker "
                                                    r"\(fixture `stack`\) and a Spark session \(fixture `spark`\)"):
        conftest.pytest_runtest_setup(_item(False, "make_spec", "platform", "stack", "spark"))
    conftest.pytest_runtest_setup(_item(False, "make_spec", "tmp_path"))  # the unit layer's own fixtures
    conftest.pytest_runtest_setup(_item(True, "platform", "stack", "spark", "airflow_db"))  # the end-to-end layer


def test_the_unit_layer_is_a_folder_and_a_marker_at_once():
    """A test under tests/unit marked slow stops the collection (`-m "not slow"` would otherwise skip it where
    `make test-unit` looks, and `make test-e2e` never looks there)."""
    in_e2e = conftest.E2E / "test_x_e2e.py"
    assert conftest.misplaced([_item(False), _item(True, path=in_e2e), _item(False, path=in_e2e)]) == []
    with pytest.raises(pytest.UsageError, match=r"marked slow but in .*tests/unit .*tests/unit/core/test_x.py::test_x"):
        conftest.pytest_collection_modifyitems([_item(False), _item(True)])
