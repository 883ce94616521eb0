"""Airflow operators, sensors, triggers and hooks for lakehouse pipelines.

Airflow puts the `plugins/` folder on `sys.path`, so DAGs import these as
`from lakehouse_airflow.sensors import FreshnessSensor`. They take a pipeline name and
read everything else from its spec, so they are reusable outside the DAGs here.
"""
