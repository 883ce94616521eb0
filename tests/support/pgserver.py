"""A throwaway PostgreSQL cluster for the tests: `initdb` into a temporary folder, started on a port of its
own on 127.0.0.1, stopped and deleted afterwards. Nothing relies on a server someone else installed,
configured or started; `make setup` installs only the server binaries (Debian package postgresql).

    with cluster(auth_host="trust") as server:      # or "scram-sha-256" (password logins over TCP)
        server.port, server.socket_dir, server.url("mydb")
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

SUPERUSER = "postgres"
HOST = "127.0.0.1"


class PostgresMissing(RuntimeError):
    """The PostgreSQL server binaries are not installed."""


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    user: str
    socket_dir: Path

    def url(self, database: str) -> str:
        """The SQLAlchemy URI of `database` on this server, as the superuser (trust: no password)."""
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{database}"


def bin_dir() -> Path:
    """The newest installed PostgreSQL server's bin folder; PostgresMissing when there is none."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise PostgresMissing("PostgreSQL server binaries (initdb) are missing: run `make setup` "
                              "(Debian package postgresql)")
    return found[-1].parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def cluster(auth_host: str = "trust", max_connections: int = 200) -> Iterator[Server]:
    """A new cluster whose TCP logins use `auth_host` (trust, or scram-sha-256 for password logins);
    local socket logins are trusted. initdb refuses to run as root, so as root the cluster runs as
    the `postgres` user the Debian package creates."""
    binaries = bin_dir()
    as_owner = ["runuser", "-u", SUPERUSER, "--"] if os.geteuid() == 0 else []
    folder = Path(tempfile.mkdtemp(prefix="lakehouse-pg-"))
    if as_owner:
        shutil.chown(folder, SUPERUSER)
    port, data = _free_port(), folder / "data"
    subprocess.run([*as_owner, str(binaries / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth-local=trust",
                    f"--auth-host={auth_host}", "--no-sync"], check=True, capture_output=True, timeout=120)
    options = (f"-p {port} -k {folder} -c listen_addresses={HOST} -c max_connections={max_connections} "
               f"-c fsync=off -c synchronous_commit=off")
    subprocess.run([*as_owner, str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w",
                    "-o", options, "start"], check=True, capture_output=True, timeout=120)
    try:
        yield Server(HOST, port, SUPERUSER, folder)
    finally:
        subprocess.run([*as_owner, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
