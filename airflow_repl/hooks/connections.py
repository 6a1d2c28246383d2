"""Airflow connections of the topology's servers: Airflow's own lookup, libpq settings as ``PostgresHook`` makes them.

A MariaDB subscriber's connection id is an Airflow ``mysql`` connection: :func:`mariadb_conninfo`.

A server named by a connection id is an Airflow **Postgres** connection (conn type ``postgres``,
of ``apache-airflow-providers-postgres``).  :func:`airflow_lookup` finds it where Airflow does:

* inside a running task, through the task SDK (the API server answers for the metadata database,
  and the worker's secrets backends come first);
* anywhere else (the ``airflow-repl`` command line, a Python script), through
  ``airflow.models.Connection.get_connection_from_secrets``: the configured secrets backend, then
  the ``AIRFLOW_CONN_<ID>`` environment variables, then the metadata database.

:func:`postgres_conninfo` turns the connection into a libpq connection string as
``PostgresHook.get_conn`` turns it into ``psycopg.connect`` arguments: host, port, login,
password, schema (= database), then **every extra** except the keys the hook keeps for itself
(:data:`HOOK_ONLY_EXTRAS`: ``cursor``, ``iam``, ``aws_conn_id``, ``sqlalchemy_*``, ...).  With
``iam`` the hook's own ``get_iam_token`` supplies login, password and port, as it does for
``get_conn``.  Nothing here logs a connection string: messages name the connection id only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from airflow.providers.postgres.hooks.postgres import PostgresHook

from airflow_repl.engine.errors import ConnectionFailed, TopologyError, redact
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres import connections

#: The connection types a server's connection may have (Airflow writes ``postgres``; a JSON
#: connection may say ``postgresql``).
POSTGRES_CONN_TYPES = ("postgres", "postgresql")
#: The connection types of a MariaDB subscriber (``apache-airflow-providers-mysql``'s ``mysql``).
MYSQL_CONN_TYPES = ("mysql", "mariadb")

#: The extras ``PostgresHook`` reads itself and never passes to libpq (its ``ignored_extra_options``:
#: cursor factory, AWS/Azure IAM tokens, Redshift, SQLAlchemy URL settings).  They are dropped here too.
HOOK_ONLY_EXTRAS: frozenset[str] = frozenset(PostgresHook.ignored_extra_options)


def postgres_conninfo(conn: Any) -> str:
    """The libpq connection string of an Airflow Postgres connection (``airflow.sdk.Connection``
    or ``airflow.models.Connection``), as ``PostgresHook.get_conn`` would connect."""
    where = f"Airflow connection {conn.conn_id!r}"
    if (conn.conn_type or "").lower() not in POSTGRES_CONN_TYPES:
        raise TopologyError(
            f"{where} has connection type {conn.conn_type or ''!r}: the topology's servers are Postgres "
            f"connections; give it the type postgres (a postgres:// or postgresql:// URI, or conn_type postgres)"
        )
    for field in ("host", "login", "password", "schema"):
        if getattr(conn, field) is not None and not isinstance(getattr(conn, field), str):
            raise TopologyError(f"{where}: {field!r} must be a string, not {type(getattr(conn, field)).__name__}")
    extra = conn.extra_dejson
    login, password, port = conn.login, conn.password, conn.port
    if extra.get("iam", False):  # a short-lived token in place of the password, from the provider itself
        login, password, port = PostgresHook(connection=conn).get_iam_token(conn)
    kept = {key: value for key, value in extra.items() if key not in HOOK_ONLY_EXTRAS}
    try:
        return connections.conninfo_from_parts(conn.host, port, login, password, conn.schema, kept)
    except TopologyError as exc:
        raise TopologyError(f"{where}: {exc}") from None


def _in_task() -> bool:
    """Whether this process talks to an Airflow supervisor (a task runner, a triggerer): the task SDK's lookup applies."""
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    return getattr(runner, "SUPERVISOR_COMMS", None) is not None


def get_connection(conn_id: str) -> Any:
    """The Airflow connection ``conn_id``, found by Airflow's own lookup (see the module's docstring)."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        if _in_task():
            from airflow.sdk import BaseHook

            return BaseHook.get_connection(conn_id)
        from airflow.models.connection import Connection

        return Connection.get_connection_from_secrets(conn_id)
    except AirflowNotFoundException:
        raise _not_found(conn_id) from None
    except Exception as exc:  # a secrets backend that cannot be reached or refuses: retryable, named
        detail = redact(" ".join(str(exc).split()))[:300]
        raise ConnectionFailed(
            f"looking up connection id {conn_id!r} through Airflow failed ({type(exc).__name__}: {detail}): "
            f"check the secrets backend ([secrets] backend) and its credentials, then run again"
        ) from None


def _not_found(conn_id: str) -> TopologyError:
    """Not defined anywhere, or defined by an environment variable Airflow cannot read (it skips
    it silently): say which, without quoting the value (it holds the password)."""
    var = f"AIRFLOW_CONN_{conn_id.upper()}"
    if os.environ.get(var) is not None:
        return TopologyError(f"the connection in environment variable {var} is malformed: {_why_unreadable(conn_id)}")
    where = "" if _in_task() else f" (looked up in the metadata database of {airflow_home()})"
    return TopologyError(
        f"connection id {conn_id!r} is not defined{where}: set the environment variable {var} "
        f"(a postgres:// URI or Airflow's JSON form), or create it with "
        f"'airflow connections add {conn_id} --conn-type postgres ...' or in the secrets backend"
    )


def airflow_home() -> str:
    """Which Airflow home (configuration, metadata database) a lookup outside a task uses, as
    messages name it: ``AIRFLOW_HOME=/path``, or Airflow's default when the variable is not set."""
    from airflow.configuration import AIRFLOW_HOME

    if os.environ.get("AIRFLOW_HOME"):
        return f"AIRFLOW_HOME={AIRFLOW_HOME}"
    return f"AIRFLOW_HOME={AIRFLOW_HOME}, Airflow's default: AIRFLOW_HOME is not set"


def _why_unreadable(conn_id: str) -> str:
    """Why Airflow's environment-variable backend cannot read the connection (its own error)."""
    from airflow.secrets.environment_variables import EnvironmentVariablesBackend

    try:
        conn = EnvironmentVariablesBackend().get_connection(conn_id)
        if conn is not None:  # read, but Airflow's lookup failed on it (e.g. a host that is not a string)
            postgres_conninfo(conn)
    except TopologyError as exc:
        return str(exc)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except ValueError as exc:  # Airflow's messages name the field, e.g. the port
        return redact(" ".join(str(exc).split()))
    except Exception as exc:  # any other failure: its type only, the message may quote the value
        return f"Airflow cannot read it ({type(exc).__name__})"
    return "Airflow cannot read it"


def mariadb_conninfo(conn: Any) -> str:
    """The ``mariadb://`` connection string of an Airflow ``mysql`` connection (of
    ``apache-airflow-providers-mysql``): host, port, login, password, schema (= database), and
    every extra but the hook's own (``cursor``, ``client``, ``iam``, ``aws_conn_id``) as the
    driver's settings (docs/subscribers-mariadb.md)."""
    try:
        return mariadb_connections.conninfo_from_parts(
            conn.host, conn.port, conn.login, conn.password, conn.schema, conn.extra_dejson
        )
    except TopologyError as exc:
        raise TopologyError(f"Airflow connection {conn.conn_id!r}: {exc}") from None


def airflow_lookup(conn_id: str) -> str:
    """A topology resolver: connection id -> connection string, through Airflow (a ``mysql``
    connection: a MariaDB subscriber's ``mariadb://`` string; otherwise libpq's)."""
    conn = get_connection(conn_id)
    if (conn.conn_type or "").lower() in MYSQL_CONN_TYPES:
        return mariadb_conninfo(conn)
    return postgres_conninfo(conn)


def resolve_topology(topo: topology.Topology) -> topology.Topology:
    """Resolve every server of ``topo`` in place: URIs as they are, connection ids through Airflow."""
    return connections.resolve_topology(topo, airflow_lookup)


def load_topology(path: str | Path) -> topology.Topology:
    """Load a topology file and resolve its servers (the Python API's entry point outside a task)."""
    return resolve_topology(topology.load(path))
