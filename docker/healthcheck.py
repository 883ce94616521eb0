"""Healthchecks of the project image's services (docker-compose.yaml); exit 0 when healthy.

    python docker/healthcheck.py http URL
        URL answers with a 2xx status (Airflow's api-server, the Spark master's UI, the object
        store's /_lakehouse/health).
    python docker/healthcheck.py spark-worker MASTER_JSON_URL WORKER_HOST
        the Spark master's status (its UI's /json/) lists an ALIVE worker on WORKER_HOST, i.e.
        the worker not only runs but has registered and can be given executors.

Prints why when unhealthy (Docker keeps the output in `docker inspect`).
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 5.0


def http_ok(url: str) -> str | None:
    """None when `url` answers 2xx, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            if 200 <= response.status < 300:
                return None
            return f"{url} answered {response.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {exc}"


def spark_worker_registered(master_json_url: str, worker_host: str) -> str | None:
    """None when the master at `master_json_url` lists an ALIVE worker on `worker_host`, else why not."""
    try:
        with urllib.request.urlopen(master_json_url, timeout=TIMEOUT_S) as response:
            status = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"{master_json_url}: {exc}"
    workers = status.get("workers") or []
    if any(w.get("host") == worker_host and w.get("state") == "ALIVE" for w in workers):
        return None
    seen = ", ".join(f"{w.get('host')} ({w.get('state')})" for w in workers) or "none"
    return f"the master lists no ALIVE worker on {worker_host}; workers: {seen}"


CHECKS = {"http": (http_ok, 1), "spark-worker": (spark_worker_registered, 2)}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in CHECKS or len(argv) - 1 != CHECKS[argv[0]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    check, _ = CHECKS[argv[0]]
    problem = check(*argv[1:])
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
