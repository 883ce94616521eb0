"""The lakehouse platform's Airflow provider (distribution `airflow-provider-lakehouse`): hooks, operators,
sensors, triggers and the Lakehouse pipelines page.

Installed into an Airflow beside the product package (`pip install ./ ./providers/lakehouse`), DAGs import
it as any package (`from lakehouse_airflow.sensors import FreshnessSensor`), and Airflow finds its hooks,
connection types, configuration and page through its entry points (get_provider_info, ui). Operators and
sensors take a pipeline name and read everything else from its spec, found by configuration
(locations), never next to this code. Nothing here is imported when Airflow reads the provider's
information: get_provider_info imports only connection_types.
"""

__version__ = "0.1.0"
