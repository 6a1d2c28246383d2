"""airflow-repl: SQL Server-style transactional replication for PostgreSQL.

The replication engine lives in :mod:`airflow_repl.engine` and never imports Airflow; the
Airflow provider layer (hooks, operators, sensors, triggers) is a thin shell around it.
"""

from __future__ import annotations

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "airflow-repl",
        "name": "Transactional replication (airflow-repl)",
        "description": "SQL Server-style transactional replication for PostgreSQL: snapshot, "
        "log reader, distribution and queue reader agents submitted as Spark applications.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "airflow-repl",
                "external-doc-url": "https://example.invalid/airflow-repl/docs",
                "tags": ["software"],
            }
        ],
        "hooks": [{"integration-name": "airflow-repl", "python-modules": ["airflow_repl.hooks.replication"]}],
        "operators": [
            {
                "integration-name": "airflow-repl",
                "python-modules": [
                    "airflow_repl.operators.agents",
                    "airflow_repl.operators.retention",
                    "airflow_repl.operators.schema",
                    "airflow_repl.operators.tracer",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "airflow-repl",
                "python-modules": ["airflow_repl.sensors.quiescing", "airflow_repl.sensors.wal_retention"],
            }
        ],
        "triggers": [
            {
                "integration-name": "airflow-repl",
                "python-modules": ["airflow_repl.triggers.quiescing", "airflow_repl.triggers.wal_retention"],
            }
        ],
    }
