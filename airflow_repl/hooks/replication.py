"""ReplicationHook: loads a topology file and resolves its servers through Airflow connections."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import topology
from airflow_repl.hooks import connections as airflow_connections


class ReplicationHook(BaseHook):
    """Access to an airflow-repl topology.

    The servers the topology names by connection id are Airflow **Postgres** connections (conn
    type ``postgres``), found by Airflow's lookup and turned into libpq settings the way
    ``PostgresHook`` does (:mod:`airflow_repl.hooks.connections`); ``postgresql://`` URIs in the
    topology are used as they are.

    The hook's own connection type, ``airflow_repl``, names a topology: its extra ``topology`` is the
    path of the topology file (docs/connections.md).  Give either ``topology_path`` or
    ``repl_conn_id``.

    :param topology_path: path of the topology YAML file.
    :param repl_conn_id: an ``airflow_repl`` connection whose extra ``topology`` is that path.
    """

    conn_name_attr = "repl_conn_id"
    default_conn_name = "airflow_repl_default"
    conn_type = "airflow_repl"
    hook_name = "Replication topology (airflow-repl)"

    def __init__(self, topology_path: str | None = None, repl_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if (topology_path is None) == (repl_conn_id is None):
            raise TopologyError("ReplicationHook takes a topology_path or a repl_conn_id (one of them)")
        self.repl_conn_id = repl_conn_id
        self.topology_path = topology_path if topology_path is not None else self._path_of(str(repl_conn_id))

    @staticmethod
    def _path_of(conn_id: str) -> str:
        """The topology path an ``airflow_repl`` connection names (its extra ``topology``)."""
        conn = airflow_connections.get_connection(conn_id)
        path = conn.extra_dejson.get("topology")
        if conn.conn_type != ReplicationHook.conn_type or not isinstance(path, str) or not path:
            raise TopologyError(
                f"Airflow connection {conn_id!r} does not name a topology: give it the type airflow_repl "
                f'and the extra {{"topology": "/path/to/topology.yaml"}}'
            )
        return path

    @staticmethod
    def resolve_connection(conn_id: str) -> str:
        """The libpq connection string of the Postgres connection ``conn_id`` (Airflow's lookup)."""
        return airflow_connections.airflow_lookup(conn_id)

    def get_topology(self) -> topology.Topology:
        return airflow_connections.load_topology(self.topology_path)

    @staticmethod
    def write_spec(topo: topology.Topology, directory: str | Path) -> Path:
        """Write the resolved topology (with passwords) to a 0600 file for a Spark job."""
        path = Path(directory) / "topology-spec.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(topo.to_dict(with_secrets=True), fh)
        return path
