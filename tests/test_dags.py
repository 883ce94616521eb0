"""DAG integrity: every DAG file parses in Airflow, and the DAGs follow from the pipeline specs."""

from pathlib import Path

import pytest

from lakehouse import config, spec as spec_module

SHIPPED = config.REPO_ROOT / "include" / "pipelines"
PER_PIPELINE = ("ingest", "maintenance", "publish", "backfill")


def dagbag(pipelines_dir: Path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(pipelines_dir))
    return DagBag(str(config.REPO_ROOT / "dags"))


@pytest.fixture
def shipped(airflow_db, monkeypatch):
    return dagbag(SHIPPED, monkeypatch)


def test_every_dag_file_imports_without_errors(shipped):
    assert shipped.import_errors == {}
    assert shipped.dag_ids


def test_each_shipped_pipeline_gets_its_dags(shipped):
    for name, spec in spec_module.load_all(SHIPPED).items():
        for kind in PER_PIPELINE:
            assert f"{name}_{kind}" in shipped.dag_ids
        if spec.publish.view:
            assert f"{name}_cutover" in shipped.dag_ids
    assert "retention_alignment" in shipped.dag_ids


def test_dags_carry_owner_tags_docs_and_valid_default_params(shipped):
    for dag_id, dag in shipped.dags.items():
        assert dag.doc_md and len(dag.doc_md) > 80, dag_id
        assert "lakehouse" in dag.tags, dag_id
        assert dag.owner == "data-platform", dag_id
        assert dag.max_active_runs == 1, dag_id
        assert not dag.catchup, dag_id
        dag.params.validate()  # the trigger form's defaults are valid as they stand
        assert dag.task_dict, dag_id  # (cycles are import errors: DagBag checks them on load)


def test_adding_a_pipeline_yaml_adds_its_dags(airflow_db, make_spec, monkeypatch):
    spec = make_spec()
    bag = dagbag(make_spec.directory, monkeypatch)
    assert bag.import_errors == {}
    assert {f"{spec.name}_{kind}" for kind in (*PER_PIPELINE, "cutover")} <= set(bag.dag_ids)


def test_a_broken_spec_shows_as_an_import_error_naming_the_field(airflow_db, make_spec, monkeypatch):
    spec = make_spec()
    Path(spec.path).write_text(Path(spec.path).read_text().replace("mode: append", "mode: sideways"))
    bag = dagbag(make_spec.directory, monkeypatch)
    assert bag.import_errors
    assert all("target.mode" in message and "sideways" in message for message in bag.import_errors.values())
