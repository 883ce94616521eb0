"""KafkaHook: the Kafka cluster, from the Airflow connection `lakehouse_kafka`.

The connection's extra is librdkafka configuration JSON, e.g.

    {"bootstrap.servers": "broker:9093", "security.protocol": "SASL_SSL",
     "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "lakehouse",
     "sasl.password": "...", "ssl.ca.location": "/etc/kafka/ca.pem"}

(host/port, login and password fill bootstrap.servers, sasl.username and sasl.password when the extra
leaves them out). Its settings override and extend the environment's (LAKEHOUSE_BOOTSTRAP_SERVERS,
LAKEHOUSE_KAFKA_*): for the hooks' platform (sensors, triggers, operators) and, as those variables,
for the Spark jobs the operators submit. Airflow masks the connection's password and password-like
extras in task logs. The test asks the cluster for its metadata (lakehouse.ops.check.check_kafka).
"""

from __future__ import annotations

from typing import Any

from lakehouse.core import config
from lakehouse_airflow.connection_types import KAFKA
from lakehouse_airflow.hooks.base import PartHook, aconnection

KAFKA_CONN_ID = KAFKA.default_conn_id


def settings_of(conn) -> dict[str, str]:
    """librdkafka settings of Airflow connection `conn`: its extra, then host/port, login, password."""
    extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
    settings = {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in extra.items()
                if v is not None and not isinstance(v, (dict, list))}
    if conn.host and "bootstrap.servers" not in settings:
        settings["bootstrap.servers"] = ",".join(
            f"{host.strip()}:{conn.port}" if conn.port and ":" not in host else host.strip()
            for host in conn.host.split(","))
    if conn.login and "sasl.username" not in settings:
        settings["sasl.username"] = conn.login
    if conn.password and "sasl.password" not in settings:
        settings["sasl.password"] = conn.password
    return settings


def kafka_environment(settings: dict[str, str]) -> dict[str, str]:
    """The LAKEHOUSE_* variables that give a process started from this one (spark-submit) the Kafka
    `settings`: LAKEHOUSE_BOOTSTRAP_SERVERS and LAKEHOUSE_KAFKA_<PROPERTY> (see lakehouse.core.config)."""
    env = {}
    for key, value in settings.items():
        if key == "bootstrap.servers":
            env["LAKEHOUSE_BOOTSTRAP_SERVERS"] = value
        else:
            env[config.kafka_variable(key)] = value
    return env


class KafkaHook(PartHook):
    """The Kafka connection `kafka_conn_id` (default `lakehouse_kafka`)."""

    kind = KAFKA
    conn_name_attr = "kafka_conn_id"
    default_conn_name = KAFKA.default_conn_id
    conn_type = KAFKA.conn_type
    hook_name = KAFKA.name

    def __init__(self, kafka_conn_id: str | None = KAFKA_CONN_ID, **kwargs: Any):
        super().__init__(kafka_conn_id, **kwargs)

    @property
    def settings(self) -> dict[str, str]:
        """The connection's librdkafka settings ({} without one). Secrets included: never log them."""
        return {} if self.connection is None else settings_of(self.connection)

    @classmethod
    def lay_over(cls, platform: config.PlatformConfig, conn) -> config.PlatformConfig:
        return platform.with_kafka(settings_of(conn))

    @classmethod
    def variables(cls, conn) -> dict[str, str]:
        return kafka_environment(settings_of(conn))

    def check(self, platform: config.PlatformConfig, timeout: float):
        from lakehouse.ops import check

        return check.check_kafka(platform, [], timeout)


def kafka_connection_settings(conn_id: str | None = KAFKA_CONN_ID) -> dict[str, str]:
    """The librdkafka settings of Kafka connection `conn_id`; {} when it is not defined (or None)."""
    return KafkaHook(conn_id).settings


async def akafka_connection_settings(conn_id: str | None = KAFKA_CONN_ID) -> dict[str, str]:
    """`kafka_connection_settings` for triggers: asks the triggerer without blocking its event loop."""
    conn = await aconnection(conn_id)
    return {} if conn is None else settings_of(conn)
