"""Spark entry point of the ingest job.

    spark-submit --packages <lakehouse.core.config.SPARK_PACKAGES> spark_jobs/ingest.py --pipeline orders --once
    lakehouse ingest --pipeline orders --trigger-interval 5s      # the same job, local Spark

Arguments are those of `lakehouse ingest`; the pipeline spec, Kafka and catalog
come from include/pipelines and the LAKEHOUSE_* environment.
"""

import sys

from lakehouse.cli import main

if __name__ == "__main__":
    sys.exit(main(["ingest", *sys.argv[1:]]))
