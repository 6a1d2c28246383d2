"""airflow-repl: SQL Server-style transactional replication for PostgreSQL.

The replication engine lives in :mod:`airflow_repl.engine` and never imports Airflow; the
Airflow provider layer (hooks, operators, sensors, triggers) is a thin shell around it.
"""

from __future__ import annotations

__version__ = "0.2.0"


def get_provider_info() -> dict:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "airflow-repl",
        "name": "Transactional replication (airflow-repl)",
        "description": "SQL Server-style transactional replication for PostgreSQL: snapshot, "
        "log reader, distribution and queue reader agents submitted as Spark applications.",
        "versions": [__version__],
        "integrations": [_integration()],
        "hooks": [
            {
                "integration-name": "airflow-repl",
                "python-modules": ["airflow_repl.hooks.replication", "airflow_repl.hooks.connections"],
            }
        ],
        "connection-types": [_connection_type()],
        "operators": [
            {
                "integration-name": "airflow-repl",
                "python-modules": [
                    "airflow_repl.operators.agents",
                    "airflow_repl.operators.retention",
                    "airflow_repl.operators.schema",
                    "airflow_repl.operators.topology",
                    "airflow_repl.operators.tracer",
                    "airflow_repl.operators.validation",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "airflow-repl",
                "python-modules": [
                    "airflow_repl.sensors.quiescing",
                    "airflow_repl.sensors.wal_retention",
                    "airflow_repl.sensors.health",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": "airflow-repl",
                "python-modules": [
                    "airflow_repl.triggers.quiescing",
                    "airflow_repl.triggers.wal_retention",
                    "airflow_repl.triggers.health",
                ],
            }
        ],
    }


def _integration() -> dict:
    """The provider's one integration.  No ``external-doc-url``: there is no public documentation
    site (the documentation is the ``docs/`` folder, installed under
    ``<prefix>/share/doc/airflow-repl``), and a path of the machine that built the package is no URL."""
    return {"integration-name": "airflow-repl", "tags": ["software"]}


def _connection_type() -> dict:
    """The ``airflow_repl`` connection type (ReplicationHook): a topology file and, optionally, a
    default publication, as two fields of its form (``conn-fields``, stored as extra keys).

    The servers themselves are ``postgres`` connections of the Postgres provider (docs/connections.md)."""
    return {
        "hook-class-name": "airflow_repl.hooks.replication.ReplicationHook",
        "hook-name": "Replication topology (airflow-repl)",
        "connection-type": "airflow_repl",
        "ui-field-behaviour": {
            "hidden-fields": ["host", "schema", "login", "password", "port", "extra"],
            "relabeling": {},
            "placeholders": {"topology": "/opt/airflow/dags/topology.yaml", "publication": "shop"},
        },
        "conn-fields": {
            "topology": {
                "label": "Topology file",
                "description": "Path of the topology YAML file, as the Airflow workers see it",
                "schema": {"type": ["string", "null"]},
            },
            "publication": {
                "label": "Default publication",
                "description": "The publication used when a task or command names none",
                "schema": {"type": ["string", "null"]},
            },
        },
    }
