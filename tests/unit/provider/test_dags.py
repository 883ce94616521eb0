"""DAG integrity: every DAG file parses in Airflow, and the DAGs follow from the pipeline specs.

Parsing is Airflow's DagBag in this process, without a metadata DB, scheduler or task run (the unit
layer); looking a DAG up with `DagBag.get_dag` reads the metadata DB, so that test is marked slow.

The unit half; the end-to-end half is tests/e2e/test_dags_e2e.py.
"""

from pathlib import Path

import pytest
import yaml

from lakehouse.core import config
from lakehouse.core import spec as spec_module

SHIPPED = config.REPO_ROOT / "include" / "pipelines"
PER_PIPELINE = ("ingest", "maintenance", "publish", "backfill")


def dagbag(pipelines_dir: Path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(pipelines_dir))
    return DagBag(str(config.REPO_ROOT / "dags"))


@pytest.fixture
def shipped(monkeypatch):
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


def test_a_scheduled_pipeline_runs_once_jobs_on_its_schedule_and_a_continuous_one_a_supervised_job(shipped):
    payments, orders = shipped.dags["payments_ingest"], shipped.dags["orders_ingest"]
    assert [t.task_id for t in payments.tasks] == ["ingest_once"] and "--once" in payments.tasks[0].application_args
    assert payments.schedule == "*/5 * * * *" and orders.schedule == "@continuous"
    assert [t.task_id for t in orders.tasks] == ["ingest_continuous"]


def test_the_pipelines_page_links_exactly_the_dags_generated(tmp_path, monkeypatch):
    """ops.history.dag_ids (the page's DAG links) names every DAG the specs generate and no other: a
    candidate pipeline, and a pipeline without a readers' view, get no cutover DAG and no link to one."""
    from lakehouse.ops.history import dag_ids

    folder = tmp_path / "pipelines"
    folder.mkdir()
    shipped_orders = yaml.safe_load((SHIPPED / "orders.yaml").read_text())

    def variant(name: str, view: str | None, **top) -> dict:
        """The shipped orders spec under its own name, topic, tables and (optional) readers' view."""
        spec = {**shipped_orders, "name": name, **top, "source": {**shipped_orders["source"], "topic": name},
                "target": {**shipped_orders["target"], "table": f"raw.{name}"},
                "dead_letter": {**shipped_orders["dead_letter"], "table": f"raw.{name}_dlq"},
                "publish": {k: v for k, v in shipped_orders["publish"].items() if k != "view"}}
        if view:
            spec["publish"]["view"] = view
        return spec

    live = variant("orders", "serve.orders")
    candidate = variant("orders_next", "serve.orders_next", candidate_for="orders")
    plain = variant("orders_plain", None)
    for spec in (live, candidate, plain):
        (folder / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))
    bag = dagbag(folder, monkeypatch)
    assert bag.import_errors == {}
    specs = spec_module.load_all(folder)
    linked = {dag for spec in specs.values() for dag in dag_ids(spec)}
    assert linked == set(bag.dag_ids)
    assert f"{live['name']}_cutover" in linked
    assert "orders_next_cutover" not in linked and "orders_plain_cutover" not in linked


def test_dags_carry_owner_tags_docs_and_valid_default_params(shipped):
    for dag_id, dag in shipped.dags.items():
        assert dag.doc_md and len(dag.doc_md) > 80, dag_id
        assert "lakehouse" in dag.tags, dag_id
        assert dag.owner == "data-platform", dag_id
        assert dag.max_active_runs == 1, dag_id
        assert not dag.catchup, dag_id
        dag.params.validate()  # the trigger form's defaults are valid as they stand
        assert dag.task_dict, dag_id  # (cycles are import errors: DagBag checks them on load)


def test_adding_a_pipeline_yaml_adds_its_dags(make_spec, monkeypatch):
    spec = make_spec()
    bag = dagbag(make_spec.directory, monkeypatch)
    assert bag.import_errors == {}
    assert {f"{spec.name}_{kind}" for kind in (*PER_PIPELINE, "cutover")} <= set(bag.dag_ids)


