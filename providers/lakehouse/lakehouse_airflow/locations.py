"""Where the provider finds the files it works from: the pipeline specs, the expectation suites and the
Spark jobs. Configuration only, never the location of this code: the provider is installed into an
Airflow (a wheel in site-packages, an image, MWAA) where nothing is next to it.

Each folder is, first found first:

    folder          environment variable           Airflow configuration ([lakehouse] in airflow.cfg,
                                                   or AIRFLOW__LAKEHOUSE__<OPTION>)
    pipeline specs  LAKEHOUSE_PIPELINES_DIR         pipelines_dir
    expectations    LAKEHOUSE_EXPECTATIONS_DIR      expectations_dir
    Spark jobs      LAKEHOUSE_SPARK_JOBS_DIR        spark_jobs_dir

The environment variable comes first because the product library and the Spark jobs read the same
variables (lakehouse.core.config); a folder found in Airflow's configuration is put into this
process's environment under its variable, so the library, and the jobs spark-submit starts from
here, read the same folder. Nothing configured is an error naming both ways to set it (a DAG file's
import error, a task's failure), never a folder guessed from where the code is. The development
stack sets the repository's folders (lakehouse_dev.airflow_stack), the compose file the image's.

The Spark jobs' location may also be a URL spark-submit fetches the application from (s3://,
hdfs://, local:// for a file inside a cluster's image): it is then used as given, unchecked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SECTION = "lakehouse"
# the Spark jobs the operators submit, spark_jobs/<job>.py in the repository
JOBS = ("ingest", "maintenance", "replay", "verify")


def _refused(message: str) -> Exception:
    """The ConfigurationError to raise; imported here, so that get_provider_info's import of this module (while
    Airflow configures itself) stays light."""
    from lakehouse.core.errors import ConfigurationError

    return ConfigurationError(message)


@dataclass(frozen=True)
class Location:
    """One configured folder: its Airflow option, its environment variable, what it holds and the repository
    folder the development stack sets it to."""

    option: str
    variable: str
    holds: str
    repository_folder: str

    def configured(self) -> tuple[str, str] | None:
        """(the configured value, where it was set), or None when neither the variable nor the option is set."""
        value = (os.environ.get(self.variable) or "").strip()
        if value:
            return value, self.variable
        from airflow.sdk.configuration import conf

        value = (conf.get(SECTION, self.option, fallback="") or "").strip()
        if value:
            return value, f"[{SECTION}] {self.option}"
        return None

    def value(self) -> tuple[str, str]:
        """(the configured value, where it was set); put into this process's environment when it came from
        Airflow's configuration. Raises ConfigurationError when it is not configured."""
        found = self.configured()
        if found is None:
            raise _refused(
                f"the folder of {self.holds} is not configured: set {self.variable} in the environment of every "
                f"Airflow component, or [{SECTION}] {self.option} in Airflow's configuration "
                f"(AIRFLOW__{SECTION.upper()}__{self.option.upper()})")
        value, source = found
        if source != self.variable:  # for the library and the jobs started from here
            os.environ[self.variable] = value
        return value, source

    def path(self) -> Path:
        """The configured folder. Raises ConfigurationError when it is not configured or not a folder."""
        value, source = self.value()
        folder = Path(value).expanduser()
        if not folder.is_dir():
            raise _refused(f"{source}={value!r} is not a folder; point it at the folder of {self.holds}")
        return folder.resolve()

    def __fspath__(self) -> str:
        """The folder, resolved now: a Location passed where a path is taken is read at each use."""
        return str(self.path())


PIPELINES = Location("pipelines_dir", "LAKEHOUSE_PIPELINES_DIR", "pipeline specs (<pipeline>.yaml)",
                     "include/pipelines")
EXPECTATIONS = Location("expectations_dir", "LAKEHOUSE_EXPECTATIONS_DIR",
                        "expectation suites of the publish audits (<suite>.json)", "include/expectations")
SPARK_JOBS = Location("spark_jobs_dir", "LAKEHOUSE_SPARK_JOBS_DIR",
                      f"Spark jobs spark-submit runs ({', '.join(j + '.py' for j in JOBS)})", "spark_jobs")
LOCATIONS = (PIPELINES, EXPECTATIONS, SPARK_JOBS)


def pipelines_dir() -> Path:
    """The folder of pipeline specs (LAKEHOUSE_PIPELINES_DIR or [lakehouse] pipelines_dir)."""
    return PIPELINES.path()


def expectations_dir() -> Path:
    """The folder of expectation suites (LAKEHOUSE_EXPECTATIONS_DIR or [lakehouse] expectations_dir)."""
    return EXPECTATIONS.path()


def spark_job(job: str) -> str:
    """The application spark-submit runs for `job` (one of JOBS): `<spark jobs folder>/<job>.py`, or, for a
    URL, `<URL>/<job>.py` unchecked. Raises ConfigurationError when the folder is not configured, is not
    a folder or does not hold the job."""
    if job not in JOBS:
        raise ValueError(f"unknown Spark job {job!r}; one of {', '.join(JOBS)}")
    value, source = SPARK_JOBS.value()
    if "://" in value:
        return f"{value.rstrip('/')}/{job}.py"
    application = SPARK_JOBS.path() / f"{job}.py"
    if not application.is_file():
        raise _refused(f"{source}={value!r} holds no {job}.py; point it at the folder of the Spark jobs "
                                 f"(the repository's spark_jobs/)")
    return str(application)
