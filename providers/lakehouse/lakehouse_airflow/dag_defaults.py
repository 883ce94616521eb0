"""What every generated DAG shares: the specs it is generated from, owners, tags, default args."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from lakehouse.core import spec as spec_module
from lakehouse.core.errors import ConfigurationError
from lakehouse_airflow import locations
from lakehouse_airflow.audit import RESTRICTED_DAG_KINDS, operator_access_control, operator_role

START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = "data-platform"


def pipelines() -> dict[str, spec_module.PipelineSpec]:
    """Every valid pipeline of the configured pipelines folder (lakehouse_airflow.locations), by name. A
    broken spec file only loses its own pipeline's DAGs, and a folder that is not configured all of them:
    the error is the import error of dags/lakehouse_specs.py (see `check_specs`), not of every DAG file."""
    try:
        folder = locations.pipelines_dir()
    except ConfigurationError:
        return {}
    return spec_module.load_all(folder)


def check_specs() -> None:
    """Raise BrokenSpecsError listing every spec file that does not load (or overlaps another), or
    ConfigurationError when the pipelines folder is not configured; dags/lakehouse_specs.py calls it, so
    Airflow shows them as that file's import error."""
    spec_module.load_specs(locations.pipelines_dir()).raise_errors()


def default_args(**overrides) -> dict:
    args = {"owner": OWNER, "retries": 1, "retry_delay": timedelta(seconds=30)}
    args.update(overrides)
    return args


def tags(spec: spec_module.PipelineSpec, *extra: str) -> list[str]:
    return ["lakehouse", f"pipeline:{spec.name}", *extra]


def spec_doc(spec: spec_module.PipelineSpec) -> str:
    """A Markdown block describing the pipeline, for DAG `doc_md`."""
    return (f"**Pipeline** `{spec.name}`: {spec.description}\n\n"
            f"- topic `{spec.source.topic}` ({spec.source.partitions} partitions) → "
            f"table `{spec.qualified(spec.target.table)}` ({spec.target.mode}), "
            f"dead letters `{spec.qualified(spec.dead_letter_table)}`\n"
            f"- SLOs: freshness {spec.slo.freshness_s:g}s, lag {spec.slo.lag_records} records / {spec.slo.lag_s:g}s\n"
            f"- spec file `{spec.path}`\n")


def pipeline_dag(spec: spec_module.PipelineSpec, kind: str, *, schedule, doc: str, extra_tags: tuple[str, ...] = (),
                 retries: int | None = None, **kwargs) -> DAG:
    """The DAG `<pipeline>_<kind>`: one run at a time, no catch-up, owner, tags and `doc_md` (the
    DAG file's `doc` followed by the pipeline's description). A DAG that changes what readers see
    (audit.RESTRICTED_DAG_KINDS) is granted to the operator role only (`access_control`, applied
    by auth managers that support DAG-level permissions; see lakehouse_airflow.audit)."""
    if kind in RESTRICTED_DAG_KINDS:
        kwargs.setdefault("access_control", operator_access_control())
        doc += (f"\n\n**Restricted** to lakehouse operators (role `{operator_role()}` where the auth manager has "
                f"DAG-level permissions; `LAKEHOUSE_OPERATORS` for any). Every run is audited on the ops timeline: "
                f"who triggered it, with which parameters, and the outcome.\n")
    return DAG(
        dag_id=spec_module.dag_id(spec.name, kind),
        schedule=schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=default_args() if retries is None else default_args(retries=retries),
        tags=tags(spec, kind, *extra_tags),
        doc_md=doc + "\n" + spec_doc(spec),
        **kwargs,
    )
