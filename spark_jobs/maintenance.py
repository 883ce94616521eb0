"""Spark entry point of table maintenance: compaction, manifests, snapshot expiry, orphan files.

    spark-submit --packages <lakehouse.core.config.SPARK_PACKAGES> spark_jobs/maintenance.py --pipeline orders
    lakehouse maintain --pipeline orders --json                  # the same job, local Spark

Prints the receipt as one JSON line and records one `maintenance` event per table on
the ops timeline; exits 1 when a table's maintenance failed. Arguments are those of
`lakehouse maintain`.
"""

import sys

from lakehouse.cli import main

if __name__ == "__main__":
    sys.exit(main(["maintain", "--json", *sys.argv[1:]]))
