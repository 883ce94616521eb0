"""Spark entry point of table maintenance: compaction, manifests, snapshot expiry, orphan files.

    spark-submit --packages <lakehouse.core.config.SPARK_PACKAGES> spark_jobs/maintenance.py --pipeline orders
    spark-submit ... spark_jobs/maintenance.py --pipeline orders --dry-run      # only list what it would do
    lakehouse maintain --pipeline orders --json                  # the same job, local Spark

Prints the receipt as one JSON line and records one `maintenance` event per table on
the ops timeline; exits 1 when a table's maintenance failed (a table that fails does not
stop the others; orphan removal refused where the table does not own its folder is such a
failure). Arguments are those of `lakehouse maintain`: `--dry-run` (or `--dry-run=true|false`,
as the maintenance DAG's `dry_run` Param renders it) rewrites, expires and deletes nothing and
lists what a run would.
"""

import sys

from lakehouse.cli import main

if __name__ == "__main__":
    sys.exit(main(["maintain", "--json", *sys.argv[1:]]))
