"""The provider's connection types, as data: what Airflow's connection form shows for each, and which hook
tests it. get_provider_info hands them to Airflow without importing a hook (Airflow reads provider info
while it configures itself); each hook class takes its conn_type, default connection id and name from here.

One connection per external part of the platform; where a connection of the default id exists, the
operators, sensors and triggers lay it over the environment's settings (lakehouse.core.config), and
give it to the Spark jobs they submit through the job's process environment, never through templated
fields. Without one, the environment alone is used, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOOKS = "lakehouse_airflow.hooks"


@dataclass(frozen=True)
class ConnectionType:
    """One connection type: `conn_type`, the hook class that tests it, its display name, the connection id
    the operators look for, and the form: hidden fields, relabelled fields, placeholders and extra fields
    (Airflow's conn-fields: stored in the connection's extra under their own names)."""

    conn_type: str
    hook_class: str
    name: str
    default_conn_id: str
    hidden: tuple[str, ...] = ()
    relabeling: dict[str, str] = field(default_factory=dict)
    placeholders: dict[str, str] = field(default_factory=dict)
    extra_fields: dict[str, dict] = field(default_factory=dict)

    def ui_field_behaviour(self) -> dict:
        """Airflow's `get_ui_field_behaviour()` answer for this type."""
        return {"hidden_fields": list(self.hidden), "relabeling": dict(self.relabeling),
                "placeholders": dict(self.placeholders)}

    def provider_info(self) -> dict:
        """This type's entry of get_provider_info()["connection-types"]."""
        entry = {"connection-type": self.conn_type, "hook-class-name": self.hook_class, "hook-name": self.name,
                 "ui-field-behaviour": {"hidden-fields": list(self.hidden), "relabeling": dict(self.relabeling),
                                        "placeholders": dict(self.placeholders)}}
        if self.extra_fields:
            entry["conn-fields"] = {name: dict(spec) for name, spec in self.extra_fields.items()}
        return entry


def _text(label: str, description: str) -> dict:
    return {"label": label, "description": description, "schema": {"type": ["string", "null"]}}


KAFKA = ConnectionType(
    conn_type="lakehouse_kafka", hook_class=f"{HOOKS}.kafka.KafkaHook", name="Lakehouse: Kafka",
    default_conn_id="lakehouse_kafka",
    hidden=("schema",),
    relabeling={"host": "Bootstrap servers", "login": "SASL username", "password": "SASL password",
                "extra": "librdkafka properties (JSON)"},
    placeholders={"host": "broker-1:9093,broker-2:9093", "port": "9093 (for servers written without one)",
                  "login": "lakehouse", "extra": '{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", '
                                                 '"ssl.ca.location": "/etc/kafka/ca.pem"}'},
)

CATALOG = ConnectionType(
    conn_type="lakehouse_catalog", hook_class=f"{HOOKS}.catalog.CatalogHook", name="Lakehouse: Iceberg catalog",
    default_conn_id="lakehouse_catalog",
    hidden=("schema", "port", "extra"),
    relabeling={"host": "Catalog URI", "login": "Database user", "password": "Database password"},
    placeholders={"host": "http://iceberg-rest:8181 (REST) or postgresql+psycopg2://db:5432/iceberg (JDBC)",
                  "login": "iceberg (JDBC catalogs)"},
    extra_fields={"warehouse": _text("Warehouse", "the warehouse location, e.g. s3://lakehouse/warehouse "
                                                  "(default: LAKEHOUSE_WAREHOUSE)")},
)

OBJECT_STORE = ConnectionType(
    conn_type="lakehouse_object_store", hook_class=f"{HOOKS}.object_store.ObjectStoreHook",
    name="Lakehouse: S3 object store", default_conn_id="lakehouse_object_store",
    hidden=("schema", "port", "extra"),
    relabeling={"host": "Endpoint URL", "login": "Access key id", "password": "Secret access key"},
    placeholders={"host": "http://minio:9000 (empty: AWS S3)"},
    extra_fields={
        "region": _text("Region", "the bucket's region, e.g. us-east-1"),
        "path_style_access": {"label": "Path-style access",
                              "description": "http://endpoint/bucket/key addressing (MinIO and most S3-compatible "
                                             "stores)", "schema": {"type": ["boolean", "null"]}},
    },
)

SCHEMA_REGISTRY = ConnectionType(
    conn_type="lakehouse_schema_registry", hook_class=f"{HOOKS}.schema_registry.SchemaRegistryHook",
    name="Lakehouse: schema registry", default_conn_id="lakehouse_schema_registry",
    hidden=("extra",),
    relabeling={"host": "Registry URL", "schema": "Scheme (when the URL has none)", "login": "User (basic auth)"},
    placeholders={"host": "https://registry:8081 or http://apicurio:8080/apis/ccompat/v7", "schema": "https"},
)

CONNECTION_TYPES = (KAFKA, CATALOG, OBJECT_STORE, SCHEMA_REGISTRY)
