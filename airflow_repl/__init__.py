"""airflow-repl: SQL Server-style transactional replication for PostgreSQL.

The replication engine lives in :mod:`airflow_repl.engine` and never imports Airflow; the
Airflow provider layer (hooks, operators, sensors, triggers) is a thin shell around it.
"""

from __future__ import annotations

import sys
from pathlib import Path

__version__ = "0.1.0"


def documentation_url() -> str | None:
    """A ``file://`` URI of the documentation's index on this machine, or None when there is none.

    There is no public documentation site: the documentation is the ``docs/`` folder, installed
    with the package under ``<prefix>/share/doc/airflow-repl`` (setup.cfg ``data_files``) and
    present in a source checkout (an editable install) next to the package."""
    for index in (
        Path(sys.prefix) / "share" / "doc" / "airflow-repl" / "index.md",
        Path(__file__).resolve().parent.parent / "docs" / "index.md",
    ):
        if index.is_file():
            return index.as_uri()
    return None


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
    """The provider's one integration; ``external-doc-url`` only when the documentation is installed."""
    doc = documentation_url()
    return {"integration-name": "airflow-repl", **({"external-doc-url": doc} if doc else {}), "tags": ["software"]}


def _connection_type() -> dict:
    """The ``airflow_repl`` connection type (ReplicationHook): it names a topology file in its extra.

    The servers themselves are ``postgres`` connections of the Postgres provider (docs/connections.md)."""
    return {
        "hook-class-name": "airflow_repl.hooks.replication.ReplicationHook",
        "hook-name": "Replication topology (airflow-repl)",
        "connection-type": "airflow_repl",
        "ui-field-behaviour": {
            "hidden-fields": ["host", "schema", "login", "password", "port"],
            "relabeling": {},
            "placeholders": {"extra": '{"topology": "/opt/airflow/dags/topology.yaml"}'},
        },
    }
