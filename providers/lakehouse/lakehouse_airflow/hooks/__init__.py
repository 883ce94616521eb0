"""The provider's hooks: one per external part of the platform, each with its connection type
(hooks.kafka, hooks.catalog, hooks.object_store, hooks.schema_registry), and LakehouseHook, which
gives an operator one pipeline's spec and the platform with those connections laid over it
(hooks.pipeline). The names DAGs and operators use are importable from here."""

from lakehouse_airflow.hooks.catalog import CATALOG_CONN_ID, CatalogHook
from lakehouse_airflow.hooks.kafka import (
    KAFKA_CONN_ID,
    KafkaHook,
    akafka_connection_settings,
    kafka_connection_settings,
    kafka_environment,
)
from lakehouse_airflow.hooks.object_store import OBJECT_STORE_CONN_ID, ObjectStoreHook
from lakehouse_airflow.hooks.pipeline import LakehouseHook, connection_environment
from lakehouse_airflow.hooks.schema_registry import SCHEMA_REGISTRY_CONN_ID, SchemaRegistryHook


def schema_registry_url(conn_id: str | None = SCHEMA_REGISTRY_CONN_ID) -> str | None:
    """The schema registry's URL (credentials as its user info, for LAKEHOUSE_SCHEMA_REGISTRY_URL) from
    Airflow connection `conn_id`; None when it is not defined (or None)."""
    return SchemaRegistryHook(conn_id).url


__all__ = [
    "CATALOG_CONN_ID", "KAFKA_CONN_ID", "OBJECT_STORE_CONN_ID", "SCHEMA_REGISTRY_CONN_ID",
    "CatalogHook", "KafkaHook", "LakehouseHook", "ObjectStoreHook", "SchemaRegistryHook",
    "akafka_connection_settings", "connection_environment", "kafka_connection_settings", "kafka_environment",
    "schema_registry_url",
]
