r"""Spark entry point of replays (offset range, time range or dead letters).

    spark-submit --packages <lakehouse.core.config.SPARK_PACKAGES> spark_jobs/replay.py \
        --pipeline orders --offsets 0:0-100

Arguments are those of `lakehouse replay`.
"""

import sys

from lakehouse.cli import main

if __name__ == "__main__":
    sys.exit(main(["replay", *sys.argv[1:]]))
