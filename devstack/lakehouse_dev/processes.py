"""The development stack's processes: started detached, recognised by their command line, stopped with care.

Every server of the stack (the Kafka broker, the object store, the REST catalog, the schema registry) runs
in a session of its own, its output appended to a log under the stack's home, and is stopped only when its
command line says it is the stack's (a recycled pid is never signalled).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

# Processes this interpreter started, kept so that `stop` can reap them (a child that is never waited for
# stays a zombie, and a zombie still "exists" for kill(pid, 0)).
_children: dict[int, subprocess.Popen] = {}


def pid_alive(pid: int | None) -> bool:
    """True when `pid` runs (a zombie, dead but not yet reaped, counts as dead)."""
    if not pid:
        return False
    proc = _children.get(pid)
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def started_here(pid: int) -> bool:
    """Whether this interpreter started `pid` (what identifies a process where there is no /proc)."""
    return pid in _children and not Path(f"/proc/{pid}").exists()


def forget(pid: int) -> None:
    """Stop tracking `pid` (it exited and was reaped by its caller)."""
    _children.pop(pid, None)


def spawn(cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """Start `cmd` detached (own session: it outlives the CLI call and ignores the terminal's Ctrl-C), its
    output appended to `log_path` after a line saying when and what started."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        log_file.write(f"\n=== {datetime.now(timezone.utc).isoformat()} starting: {' '.join(cmd)}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env)
    _children[proc.pid] = proc
    return proc


def stop(pid: int | None, is_ours: Callable[[int], bool], timeout: float) -> bool:
    """SIGTERM `pid`, SIGKILL it after `timeout` seconds; True if it was running. A pid `is_ours` does not
    recognise is left alone. Raises ProcessLookupError-free; RuntimeError when it survives SIGKILL."""
    if not pid or not (pid_alive(pid) and is_ours(pid)):
        if pid:
            _children.pop(pid, None)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    proc = _children.pop(pid, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    if pid_alive(pid):
        raise RuntimeError(f"process {pid} survived SIGKILL")
    return True


def command_line(pid: int) -> list[bytes] | None:
    """The arguments of process `pid` (/proc/<pid>/cmdline), None when they cannot be read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None


def port_free(port: int) -> bool:
    """Whether a server could bind 127.0.0.1:`port` (SO_REUSEADDR, as servers' listeners do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(start: int, taken: set[int] = frozenset()) -> int:
    """The first port from `start` (within 50) that is free and not in `taken`, else any free port."""
    for candidate in range(start, min(start + 50, 65536)):
        if candidate not in taken and port_free(candidate):
            return candidate
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of log `path`, indented, for an error message."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "    (no log)"
    tail = text.strip().splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) or "    (empty)"
