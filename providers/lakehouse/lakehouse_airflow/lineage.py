"""Whether Airflow's OpenLineage provider emits events from this process."""

from __future__ import annotations


def openlineage_enabled() -> bool:
    """Whether Airflow's OpenLineage provider emits events from this process (installed, configured and
    not disabled): operators then gather their datasets while they run, since the provider asks for them
    from a forked process with a deadline, where no connection or catalog should be opened."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    return not conf.is_disabled()
