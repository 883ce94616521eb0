"""Kafka topics to governed Apache Iceberg tables, exactly once, operated from Airflow.

The package by concern, each importing only the floors above it in this list (tests/unit/house/test_architecture.py):

    core/      what every part shares: configuration from the environment (config), the pipeline spec
               (spec), one error hierarchy (errors), offsets in snapshot summaries and the committed
               position (offsets), one catalog per process (catalog), the ops timeline (events), the
               Spark session (sparkenv), Kafka security and topics, and the fault hook (hooks)
    ingest/    one batch, Kafka to Iceberg: plan the offset ranges (plan), read and decode them in Spark
               tasks (reader, records; Avro and writer schemas: formats), write the tables' files in the
               tasks (taskwriter), commit them from the driver (committer), create and evolve the tables
               (tables), the job loop (job)
    upkeep/    the tables' and the topic's housekeeping: compaction and snapshot maintenance
               (maintenance; its receipts: maintenance_receipts; the proof that a table owns its folder:
               ownership, over storage_paths), retention alignment (retention)
    recovery/  re-ingesting what Kafka still holds: replay of offsets, time ranges and dead letters
               (replay), DAG-triggered backfills (backfill)
    ops/       what operators watch: status and lag (status), history, SLOs, Prometheus metrics,
               supervision of the continuous jobs
    wap/       write-audit-publish: quality checks (quality), moving the published branch (publish),
               switching readers between pipelines (cutover)
    cli.py     the `lakehouse` command

The local development stack (embedded broker, Spark cluster, Airflow, producer) is its own distribution,
`lakehouse_dev` in devstack/; the DAGs are in dags/, the Airflow hooks, operators, sensors and page in the
provider distribution providers/lakehouse/ (`lakehouse_airflow`).
"""
