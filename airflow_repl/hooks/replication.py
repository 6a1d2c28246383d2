"""ReplicationHook: loads a topology file and resolves its servers through Airflow connections."""

from __future__ import annotations

import json
import os
from pathlib import Path

from airflow.sdk import BaseHook

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres import connections


class ReplicationHook(BaseHook):
    """Access to an airflow-repl topology.

    Servers named by connection id are read from Airflow's connections (conn type
    ``postgres``: host, port, login, password, schema = database); ``postgresql://`` URIs in the
    topology are used as they are.

    :param topology_path: path of the topology YAML file.
    """

    hook_name = "airflow-repl topology"

    def __init__(self, topology_path: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.topology_path = topology_path

    @staticmethod
    def resolve_connection(conn_id: str) -> str:
        try:
            conn = BaseHook.get_connection(conn_id)
        except Exception as exc:  # AirflowNotFoundException and friends
            raise TopologyError(
                f"Airflow connection {conn_id!r} named in the topology is not defined: "
                f"create it (conn type postgres) or use a postgresql:// URI"
            ) from exc
        return connections.conninfo_from_parts(
            conn.host, conn.port, conn.login, conn.password, conn.schema, conn.extra_dejson
        )

    def get_topology(self) -> topology.Topology:
        return connections.resolve_topology(topology.load(self.topology_path), self.resolve_connection)

    @staticmethod
    def write_spec(topo: topology.Topology, directory: str | Path) -> Path:
        """Write the resolved topology (with passwords) to a 0600 file for a Spark job."""
        path = Path(directory) / "topology-spec.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(topo.to_dict(with_secrets=True), fh)
        return path
