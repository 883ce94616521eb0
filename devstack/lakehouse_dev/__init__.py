"""The local development stack, outside the product wheel.

    stack          the embedded Apache Kafka broker, the SQLite catalog and the local warehouse
    kafka_broker   Apache Kafka (KRaft) from Maven Central jars: its configuration, listeners, users and ACLs
    jvm            where the JVM parts' jars are (resolved by `make setup`) and which `java` runs them
    spark_cluster  a Spark standalone master and worker from the pip pyspark
    airflow_stack  Airflow 3's API server, scheduler, DAG processor and triggerer
    produce        sends synthetic records (some of them bad) to a pipeline's topic (`lakehouse produce`):
                   synthesis (the records, without Kafka), record_stream / change_streams (an append or
                   upsert pipeline's records / a Debezium change stream), record_factory (valid records),
                   defects (the kinds of bad record and how one is broken), pattern_strings, verdicts (the
                   reader's verdict on each), record_formats (each format's writer), producer_settings,
                   rate_limit
    settings       what the running stack tells the product's configuration (entry point `lakehouse.settings`)
    cli            the `lakehouse stack|airflow|produce` commands (entry points `lakehouse.commands`)
"""
