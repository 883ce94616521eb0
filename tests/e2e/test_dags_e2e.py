"""DAG integrity: every DAG file parses in Airflow, and the DAGs follow from the pipeline specs.

Parsing is Airflow's DagBag in this process, without a metadata DB, scheduler or task run (the unit
layer); looking a DAG up with `DagBag.get_dag` reads the metadata DB, so that test is marked slow.

The end-to-end half; the unit half is tests/unit/provider/test_dags.py.
"""

from pathlib import Path

import pytest

from lakehouse.core import config
from tests.unit.provider.test_dags import (  # noqa: F401 - fixtures among them
    PER_PIPELINE,
    dagbag,
)


SPECS_DAG_FILE = config.REPO_ROOT / "dags" / "lakehouse_specs.py"


@pytest.mark.slow
def test_a_broken_spec_is_the_import_error_of_the_specs_file_only(airflow_db, make_spec, monkeypatch):
    """One broken file, and two files claiming one table, lose their own DAGs; the valid pipeline keeps its
    DAGs, and only dags/lakehouse_specs.py fails to import, naming each broken file, field and why."""
    valid, broken, first = make_spec(), make_spec(), make_spec()
    Path(broken.path).write_text(Path(broken.path).read_text().replace("mode: append", "mode: sideways"))
    second = make_spec(target={"table": first.target.table})
    bag = dagbag(make_spec.directory, monkeypatch)
    assert set(bag.import_errors) == {str(SPECS_DAG_FILE)}
    message = bag.import_errors[str(SPECS_DAG_FILE)]
    assert "target.mode" in message and "sideways" in message and broken.path in message
    line = Path(first.path).read_text().splitlines().index(f"  table: {first.target.table}") + 1
    assert f"{first.path}:{line}: target.table: '{first.target.table}' is also a data table of pipeline " \
           f"'{second.name}' ({second.path})" in message
    assert f"{second.path}:{line}: target.table:" in message
    assert {f"{valid.name}_{kind}" for kind in (*PER_PIPELINE, "cutover")} <= set(bag.dag_ids)
    assert valid.name in bag.get_dag("retention_alignment").doc_md
    for gone in (broken, first, second):
        assert not [dag_id for dag_id in bag.dag_ids if dag_id.startswith(f"{gone.name}_")], gone.name
