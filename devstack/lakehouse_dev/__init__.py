"""The local development stack, outside the product wheel.

    stack          the embedded Apache Kafka broker, the SQLite catalog and the local warehouse
    kafka_broker   Apache Kafka (KRaft) from Maven Central jars: its configuration, listeners, users and ACLs
    jvm            where the JVM parts' jars are (resolved by `make setup`) and which `java` runs them
    spark_cluster  a Spark standalone master and worker from the pip pyspark
    airflow_stack  Airflow 3's API server, scheduler, DAG processor and triggerer
    produce        synthetic records (some of them bad) for a pipeline's topic
    settings       what the running stack tells the product's configuration (entry point `lakehouse.settings`)
    cli            the `lakehouse stack|airflow|produce` commands (entry points `lakehouse.commands`)
"""
