"""The two test layers are checked (tests/conftest.py): a test that is not marked slow (the unit layer)
cannot start a Spark session, the embedded stack, Airflow or a `lakehouse` process, nor ask for the
fixtures that start them. These tests are themselves in the unit layer, so each refusal is real."""

import subprocess
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


def _item(slow: bool, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid="tests/test_x.py::test_x", fixturenames=list(fixtures),
                           get_closest_marker=lambda name: object() if slow and name == "slow" else None)


def test_a_unit_test_asking_for_an_end_to_end_fixture_fails_before_its_set_up():
    with pytest.raises(pytest.fail.Exception, match=r"test_x is in the unit layer .* starts the embedded broker "
                                                    r"\(fixture `stack`\) and a Spark session \(fixture `spark`\)"):
        conftest.pytest_runtest_setup(_item(False, "make_spec", "platform", "stack", "spark"))
    conftest.pytest_runtest_setup(_item(False, "make_spec", "tmp_path"))  # the unit layer's own fixtures
    conftest.pytest_runtest_setup(_item(True, "platform", "stack", "spark", "airflow_db"))  # the end-to-end layer
