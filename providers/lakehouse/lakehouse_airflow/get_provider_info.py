"""What Airflow's ProvidersManager reads about this provider (entry point `apache_airflow_provider`): its
hooks, operators, sensors and triggers by module, its connection types with their forms, its page (the
plugin, also registered through the entry point `airflow.plugins`) and its configuration section
`[lakehouse]` (the folders of lakehouse_airflow.locations).

Airflow calls this while it sets up its own configuration, so it imports nothing of Airflow's and no
hook: the connection types are data (connection_types), the options locations' own (its ConfigurationError is
imported only when raised).
"""

from __future__ import annotations

from lakehouse_airflow import __version__
from lakehouse_airflow.connection_types import CONNECTION_TYPES
from lakehouse_airflow.locations import LOCATIONS, SECTION, SPARK_JOBS, Location

PACKAGE_NAME = "airflow-provider-lakehouse"
INTEGRATION = "Lakehouse"
OPERATOR_MODULES = tuple(f"lakehouse_airflow.operators.{name}" for name in (
    "backfill", "cutover", "maintenance", "publish", "quality", "retention", "supervision", "verify"))
HOOK_MODULES = tuple(f"lakehouse_airflow.hooks.{name}" for name in (
    "pipeline", "kafka", "catalog", "object_store", "schema_registry"))


def _option(location: Location) -> dict:
    """The [lakehouse] option of `location` (airflow.cfg, AIRFLOW__LAKEHOUSE__<OPTION>), as `airflow config list`
    shows it."""
    spark = " Or a URL spark-submit fetches them from (s3://..., local:///... inside a cluster's image)." \
        if location is SPARK_JOBS else ""
    return {"description": f"The folder of {location.holds}.{spark} The environment variable {location.variable} "
                           f"wins when set; one of them must be set in every Airflow component.\n",
            "version_added": "0.1.0", "type": "string", "example": f"/opt/lakehouse/{location.repository_folder}",
            "default": ""}


def get_provider_info() -> dict:
    return {
        "package-name": PACKAGE_NAME,
        "name": "Lakehouse",
        "description": "Kafka topics to governed Apache Iceberg tables, exactly once: ingestion, maintenance, "
                       "retention, write-audit-publish, backfills and cutovers of lakehouse pipelines.\n",
        "versions": [__version__],
        "integrations": [{"integration-name": INTEGRATION, "tags": ["service"]}],
        "operators": [{"integration-name": INTEGRATION, "python-modules": list(OPERATOR_MODULES)}],
        "sensors": [{"integration-name": INTEGRATION, "python-modules": ["lakehouse_airflow.sensors"]}],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": list(HOOK_MODULES)}],
        "triggers": [{"integration-name": INTEGRATION, "python-modules": ["lakehouse_airflow.triggers"]}],
        "connection-types": [kind.provider_info() for kind in CONNECTION_TYPES],
        "plugins": [{"name": "lakehouse_ui", "plugin-class": "lakehouse_airflow.ui.LakehouseUIPlugin"}],
        "config": {
            SECTION: {
                "description": "Where the lakehouse provider finds its files (lakehouse_airflow.locations).\n",
                "options": {location.option: _option(location) for location in LOCATIONS},
            },
        },
    }
