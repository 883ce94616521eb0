"""Preparation steps of the `airflow-init` service (docker/airflow-init.sh) that need Python.

    python docker/airflow_init.py

1. Writes the simple auth manager's password file (AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE)
   so the one user of AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS logs in with AIRFLOW_ADMIN_PASSWORD.
   Airflow would otherwise generate a password and print it to the api-server's log.
2. Opens the platform's Iceberg catalog once (lakehouse.core.catalog.open_catalog), as Spark and the
   status pages will: a REST catalog (the compose stack's, LAKEHOUSE_CATALOG_URI=http://iceberg-rest:8181)
   must answer GET /v1/config, and nothing is created on it (the pipelines create their namespaces and
   tables); a JDBC catalog gets its tables, so the first Spark job and the first status page find them.

Exits 2 with a message naming the variable when the configuration is unusable. Never prints
a password.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


class InitError(RuntimeError):
    """The environment does not let airflow-init do its job; the message says which variable."""


def admin_user() -> str:
    """The only user of AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS, as Airflow itself parses it."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    users = SimpleAuthManager.get_users()
    if len(users) != 1:
        names = ", ".join(user.username for user in users) or "none"
        raise InitError(f"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS must name exactly one user (name:role), "
                        f"found {names}")
    return users[0].username


def write_password_file() -> Path:
    """Write {admin user: AIRFLOW_ADMIN_PASSWORD} to the auth manager's password file, owner-only,
    replacing it whole (a changed .env password takes effect on the next `up`). Returns its path."""
    password = os.environ.get("AIRFLOW_ADMIN_PASSWORD", "")
    if not password:
        raise InitError("AIRFLOW_ADMIN_PASSWORD is empty: set it in .env")
    target = os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", "")
    if not target:
        raise InitError("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE is not set")
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".passwords-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump({admin_user(): password}, handle)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def open_platform_catalog(catalog_name: str = "lake") -> str:
    """Open the platform's Iceberg catalog `catalog_name` once: a REST catalog answers its configuration
    request, a JDBC catalog creates its tables if missing. Returns the catalog's type (rest, jdbc...)."""
    from lakehouse.core import config
    from lakehouse.core.catalog import open_catalog

    platform = config.load()
    catalog = open_catalog(platform, catalog_name)
    engine = getattr(catalog, "engine", None)  # a JDBC catalog's connection pool
    if engine is not None:
        engine.dispose()
    return platform.catalog(catalog_name).type


def main() -> int:
    try:
        path = write_password_file()
        print(f"airflow-init: password file {path} written for user {admin_user()}")
        kind = open_platform_catalog()
        print(f"airflow-init: Iceberg catalog ready ({kind}"
              f"{': nothing created, the pipelines create their tables' if kind == 'rest' else ''})")
    except InitError as exc:
        print(f"airflow-init: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
