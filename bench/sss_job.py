"""The Structured Streaming peer of the benchmark (bench/peers.py): Spark's Kafka source into an Iceberg table.

What a Spark user writes to land a JSON topic in Iceberg: `readStream.format("kafka")` (read_committed,
from the earliest offset on first start, failOnDataLoss), `from_json` with the table's schema (records
that do not parse become rows of nulls: Spark's PERMISSIVE mode), each record's coordinates kept in a
`_kafka` struct, and Iceberg's streaming writer (`fanout-enabled`: no sort by partition) with a
processing-time trigger, or availableNow over the backlog it finds. Offsets live in the checkpoint;
Iceberg skips an epoch it already committed, so a restart after kill -9 neither loses nor duplicates.

The Spark session is the platform's (lakehouse.core.sparkenv: the same catalog, master and memory as
the pipeline's driver); Spark's Kafka source comes from LAKEHOUSE_JARS (bench/jvm/spark-kafka/lib).

    python bench/sss_job.py --topic T --table lake.peers.t --checkpoint DIR --trigger-s 1 [--available-now]
"""

from __future__ import annotations

import argparse
import sys

from lakehouse.core import config, sparkenv

SCHEMA = "order_id STRING, customer_id STRING, amount DOUBLE, currency STRING, status STRING, event_time TIMESTAMP"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", required=True, help="catalog.namespace.table, created beforehand")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--trigger-s", type=float, default=1.0)
    parser.add_argument("--available-now", action="store_true", help="drain the backlog found, then stop")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=0)
    parser.add_argument("--app", default="bench-sss")
    args = parser.parse_args(argv)

    platform = config.load()
    spark = sparkenv.session(platform, [args.table.split(".")[0]], args.app)
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", platform.bootstrap_servers)
              .option("subscribe", args.topic).option("startingOffsets", "earliest")
              .option("kafka.isolation.level", "read_committed").option("failOnDataLoss", "true"))
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
    source = reader.load()
    rows = source.select(
        F.from_json(F.col("value").cast("string"), SCHEMA).alias("r"),
        F.struct(F.col("topic"), F.col("partition"), F.col("offset"), F.col("timestamp"),
                 F.col("key").cast("string").alias("key")).alias("_kafka"),
        F.current_timestamp().alias("_ingested_at"),
    ).select("r.*", "_kafka", "_ingested_at")
    writer = (rows.writeStream.format("iceberg").outputMode("append").option("checkpointLocation", args.checkpoint)
              .option("fanout-enabled", "true"))
    writer = writer.trigger(availableNow=True) if args.available_now \
        else writer.trigger(processingTime=f"{int(args.trigger_s * 1000)} milliseconds")
    query = writer.toTable(args.table)
    print(f"sss_job: query {query.id} started on {args.topic} -> {args.table}", flush=True)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
