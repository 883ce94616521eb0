"""What the running development stack tells the product's configuration.

`lakehouse.core.config.load()` asks every `lakehouse.settings` entry point for defaults under the
LAKEHOUSE_* variables; this one reads the state files the stack's components write under
LAKEHOUSE_HOME: `stack.json` (the embedded broker's address and, when it requires a login or TLS,
how to reach it and where its generated password is kept; the optional servers: the object store,
the REST catalog, the schema registry) and `spark-cluster.json` (the standalone master's URL).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lakehouse.core.errors import ConfigurationError


def read_state_file(home: Path, name: str = "stack.json") -> dict:
    """The JSON object a stack component keeps in `<home>/<name>`; {} when it is missing or unreadable."""
    try:
        state = json.loads((home / name).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def embedded_broker_security() -> tuple[str | None, str | None]:
    """The raw LAKEHOUSE_BROKER_AUTH and LAKEHOUSE_BROKER_TLS values (None when unset or empty);
    `lakehouse_dev.stack` validates them when it starts the embedded broker."""
    return (os.environ.get("LAKEHOUSE_BROKER_AUTH") or None, os.environ.get("LAKEHOUSE_BROKER_TLS") or None)


def embedded_kafka_security(home: Path, state: dict) -> dict[str, str]:
    """librdkafka security settings of the embedded broker, as its state file describes them.

    The password is read from the owner-only file the state names. Raises ConfigurationError when
    that file cannot be read (the stack's home belongs to someone else, or was half deleted).
    """
    security = state.get("security") or {}
    if not isinstance(security, dict) or not security.get("protocol"):
        return {}
    conf = {"security.protocol": security["protocol"]}
    if security.get("mechanism"):
        password_file = Path(security.get("password_file") or home / "security" / "kafka.password")
        try:
            password = password_file.read_text().strip()
        except OSError as exc:
            raise ConfigurationError(f"the embedded broker requires {security['mechanism']} authentication but "
                                     f"its password file {password_file} cannot be read ({exc.strerror}); run as "
                                     f"the user who started the stack, or restart it with `lakehouse stack down` "
                                     f"and `lakehouse stack up --auth scram-sha-512 --tls`") from None
        conf.update({"sasl.mechanism": security["mechanism"], "sasl.username": security.get("username", ""),
                     "sasl.password": password})
    if security.get("ca_location"):
        conf["ssl.ca.location"] = security["ca_location"]
    return conf


class EmbeddedStack:
    """The `lakehouse.settings` provider of the development stack (entry point `embedded`)."""

    FILES = ("stack.json", "spark-cluster.json")

    def version(self, home: Path) -> tuple:
        """What changes whenever the stack's state does: its state files' modification times."""
        stamps = []
        for name in self.FILES:
            try:
                stamps.append((home / name).stat().st_mtime_ns)
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def settings(self, home: Path) -> dict:
        """The stack's `bootstrap_servers`, Kafka security settings (`kafka`) and `spark_master`, and for the
        optional servers it started (lakehouse_dev.services) the REST catalog's `catalog_uri`, the object
        store's `warehouse` and `object_store` settings (its generated key among them) and the registry's
        `schema_registry_url` (with its user's credentials): for what runs."""
        from lakehouse_dev import services

        state = read_state_file(home)
        settings: dict = {}
        if state.get("bootstrap_servers"):
            settings["bootstrap_servers"] = state["bootstrap_servers"]
        kafka = embedded_kafka_security(home, state)
        if kafka:
            settings["kafka"] = kafka
        servers = state.get("services") or {}
        if servers.get("object_store"):
            settings["warehouse"] = servers["object_store"]["warehouse"]
            settings["object_store"] = services.object_store_settings(home, servers["object_store"])
        if servers.get("rest_catalog"):
            settings["catalog_uri"] = servers["rest_catalog"]["url"]
        if servers.get("registry"):
            settings["schema_registry_url"] = services.registry_url(home, servers["registry"])
        master = read_state_file(home, "spark-cluster.json").get("master")
        if master:
            settings["spark_master"] = master
        return settings


EMBEDDED = EmbeddedStack()
