"""Facts about the machine and the software versions, for the report's first section."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import psutil


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def java_version() -> str:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    first = (done.stderr or done.stdout).strip().splitlines()
    return first[0] if first else "unknown"


def iceberg_runtime() -> str:
    """The Iceberg Spark runtime the platform loads, by its Maven coordinate."""
    from lakehouse.core import config

    for coordinate in config.load().spark_packages:
        match = re.fullmatch(r"org\.apache\.iceberg:iceberg-spark-runtime-([\d.]+)_([\d.]+):(.+)", coordinate)
        if match:
            return f"{match.group(3)} (Spark {match.group(1)}, Scala {match.group(2)})"
    return "not found"


def broker_version() -> str:
    """The Apache Kafka version of the embedded broker, from the jars the stack runs."""
    from lakehouse_dev import jvm

    try:
        jars = sorted(p.name for p in jvm.lib("kafka").glob("kafka-clients-*.jar"))
    except jvm.JvmPartMissing:
        return "Apache Kafka (jars not resolved)"
    match = re.search(r"kafka-clients-(.+)\.jar", jars[0]) if jars else None
    return f"Apache Kafka {match.group(1) if match else 'unknown'} (KRaft, one node, log on disk)"


def load_average() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return " / ".join(f"{v:.2f}" for v in load) + " (1 / 5 / 15 min)"


def facts() -> dict[str, str]:
    """CPU, cores, memory, OS, load, and the versions of everything on the data path."""
    import confluent_kafka

    memory = psutil.virtual_memory()
    return {
        "cpu": cpu_model(),
        "cores": f"{psutil.cpu_count(logical=True)} logical ({psutil.cpu_count(logical=False) or '?'} physical)",
        "memory": f"{memory.total / 2**30:.1f} GiB ({memory.available / 2**30:.1f} GiB available at start)",
        "os": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "load average at start": load_average(),
        "python": sys.version.split()[0],
        "java": java_version(),
        "spark (pyspark)": _version("pyspark"),
        "iceberg spark runtime": iceberg_runtime(),
        "pyiceberg": _version("pyiceberg"),
        "pyarrow": _version("pyarrow"),
        "confluent-kafka": f"{_version('confluent-kafka')} (librdkafka {confluent_kafka.libversion()[0]})",
        "broker": broker_version(),
        "catalog": "Iceberg JDBC catalog on SQLite (shared by Spark and pyiceberg)",
    }
