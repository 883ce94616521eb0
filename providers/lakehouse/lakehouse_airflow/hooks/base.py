"""PartHook: the Airflow connection of one external part of the platform (Kafka, the Iceberg catalog, the
object store, the schema registry), what it changes in the platform's configuration, what it gives a
submitted job, and Airflow's connection test, which asks the part itself.

A connection is optional: without one (no connection of that id, or the id None) the platform keeps what
the environment says (lakehouse.core.config) and a job gets nothing from it. With one, its settings are
laid over the environment's (`platform`) and, for spark-submit, put into the job's process environment
(`environment`: secrets included, so never into templated fields or XCom).

`test_connection` (Airflow's Test button and `airflow connections test`) answers with the same check
`lakehouse check` runs for that part (lakehouse.ops.check), on the environment's settings with this
connection laid over them, within TEST_TIMEOUT_S: (True, what the part answered) or (False, why not,
and what to correct in the connection).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from lakehouse.core import config
from lakehouse.core.errors import LakehouseError
from lakehouse_airflow.connection_types import ConnectionType


def extra_field(conn, kind: ConnectionType, name: str):
    """The extra field `name` of connection `conn` (a form's conn-field), under its own name or, as older
    Airflow forms stored it, `extra__<conn_type>__<name>`; None when absent."""
    extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
    value = extra.get(name)
    return extra.get(f"extra__{kind.conn_type}__{name}") if value is None else value


async def aconnection(conn_id: str | None):
    """The Airflow connection `conn_id` without blocking an event loop (triggers); None when it is not defined."""
    if not conn_id:
        return None
    try:
        return await BaseHook.aget_connection(conn_id)
    except AirflowNotFoundException:
        return None


class PartHook(BaseHook):
    """The connection `conn_id` of one part; subclasses set `kind` (connection_types) and the three
    classmethods/methods below."""

    kind: ClassVar[ConnectionType]
    TEST_TIMEOUT_S: ClassVar[float] = 10.0

    def __init__(self, conn_id: str | None, **kwargs: Any):
        super().__init__(**kwargs)
        self.conn_id = conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form (Airflow before 3.2; later ones read it from get_provider_info)."""
        return cls.kind.ui_field_behaviour()

    @cached_property
    def connection(self):
        """The Airflow connection `conn_id`; None when it is not defined (or the id is None)."""
        if not self.conn_id:
            return None
        try:
            return self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            return None

    # ------------------------------------------------------------------ what a subclass says

    @classmethod
    def lay_over(cls, platform: config.PlatformConfig, conn) -> config.PlatformConfig:
        """`platform` with connection `conn`'s settings laid over it. Raises ConfigurationError for a
        connection whose settings cannot be used, naming the field."""
        raise NotImplementedError

    @classmethod
    def variables(cls, conn) -> dict[str, str]:
        """The LAKEHOUSE_* (and AWS_*) variables that give a process started from this one connection `conn`'s
        settings, secrets included."""
        raise NotImplementedError

    def check(self, platform: config.PlatformConfig, timeout: float):
        """lakehouse.ops.check's PartCheck of this part on `platform`."""
        raise NotImplementedError

    # ------------------------------------------------------------------ what every part does the same way

    def platform(self, base: config.PlatformConfig | None = None) -> config.PlatformConfig:
        """`base` (default: the environment's, config.load()) with this connection laid over it, if it exists."""
        base = base or config.load()
        return base if self.connection is None else self.lay_over(base, self.connection)

    def environment(self) -> dict[str, str]:
        """`variables` of this connection; {} without one. Secrets included: for a process environment only."""
        return {} if self.connection is None else self.variables(self.connection)

    def test_connection(self) -> tuple[bool, str]:
        """(True, what the part answered) when it answers with this connection's settings, else (False, why)."""
        if self.connection is None:
            return False, f"there is no Airflow connection {self.conn_id!r} to test"
        try:  # settings the part cannot be asked with fail before anything is asked (their errors name them)
            checked = self.check(self.platform(), self.TEST_TIMEOUT_S)
        except LakehouseError as exc:
            return False, str(exc)
        if checked.ok:
            return True, f"{checked.target}: {checked.detail}"
        detail = checked.detail if checked.detail.endswith((".", "?", "!")) else checked.detail + "."
        return False, f"{checked.target}: {detail} {self.fix}"

    @property
    def fix(self) -> str:
        """What to look at in the connection when its test fails."""
        fields = ", ".join(label.lower() for name, label in self.kind.relabeling.items() if name != "extra")
        return f"Check the connection {self.conn_id!r} ({fields}) and that the part runs and is reachable from here"
