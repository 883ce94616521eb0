"""Spark entry point of exactly-once verification (lakehouse.audit.verify).

    spark-submit --packages <lakehouse.core.config.SPARK_PACKAGES> spark_jobs/verify.py --pipeline orders --engine spark
    lakehouse verify --pipeline orders --engine spark       # the same job, Spark on the platform's master

Prints the verification (with `--json`, one JSON document) and records a `verify` event on the ops
timeline; exits 3 when offsets are missing, duplicated, foreign or stale. Arguments are those of
`lakehouse verify`.
"""

import sys

from lakehouse.cli import main

if __name__ == "__main__":
    sys.exit(main(["verify", *sys.argv[1:]]))
