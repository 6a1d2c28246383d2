"""ReplicationHook: loads a topology file and resolves its servers through Airflow connections."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook

from airflow_repl.engine.errors import ReplError, TopologyError, redact
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres import connections
from airflow_repl.hooks import connections as airflow_connections


class ReplicationHook(BaseHook):
    """Access to an airflow-repl topology.

    The servers the topology names by connection id are Airflow **Postgres** connections (conn
    type ``postgres``), found by Airflow's lookup and turned into libpq settings the way
    ``PostgresHook`` does (:mod:`airflow_repl.hooks.connections`); ``postgresql://`` URIs in the
    topology are used as they are.

    The hook's own connection type, ``airflow_repl``, names a topology: its field ``topology``
    (an extra key) is the path of the topology file, and its optional field ``publication`` a
    default publication, :attr:`publication` (docs/connections.md).  Give either
    ``topology_path`` or ``repl_conn_id``.  :meth:`test_connection` (the UI's *Test* button)
    loads the topology and connects to each of its servers.

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
        #: the connection's default publication (its field ``publication``), None when it has none
        self.publication: str | None = None
        if topology_path is not None:
            self.topology_path = topology_path
        else:
            self.topology_path, self.publication = self._fields_of(str(repl_conn_id))

    @staticmethod
    def _field(extra: dict[str, Any], name: str) -> Any:
        """An ``airflow_repl`` field of the connection's extra: ``name``, or the form's prefixed
        ``extra__airflow_repl__<name>`` of older Airflow UIs."""
        value = extra.get(name)
        return value if value not in (None, "") else extra.get(f"extra__{ReplicationHook.conn_type}__{name}")

    @staticmethod
    def _fields_of(conn_id: str) -> tuple[str, str | None]:
        """The topology path and the default publication an ``airflow_repl`` connection names."""
        conn = airflow_connections.get_connection(conn_id)
        extra = conn.extra_dejson
        path, publication = ReplicationHook._field(extra, "topology"), ReplicationHook._field(extra, "publication")
        if conn.conn_type != ReplicationHook.conn_type or not isinstance(path, str) or not path:
            raise TopologyError(
                f"Airflow connection {conn_id!r} does not name a topology: give it the type airflow_repl "
                f'and the extra {{"topology": "/path/to/topology.yaml"}}'
            )
        if publication is not None and (not isinstance(publication, str) or not publication.strip()):
            raise TopologyError(
                f"Airflow connection {conn_id!r}: its publication must be a publication's name: "
                f"set it to one, or remove it"
            )
        return path, publication or None

    @staticmethod
    def resolve_connection(conn_id: str) -> str:
        """The libpq connection string of the Postgres connection ``conn_id`` (Airflow's lookup)."""
        return airflow_connections.airflow_lookup(conn_id)

    def get_topology(self) -> topology.Topology:
        return airflow_connections.load_topology(self.topology_path)

    def test_connection(self) -> tuple[bool, str]:
        """Load the topology (and its default publication, when the connection names one) and
        connect to each of its servers: ``(True, what was reached)``, or ``(False, the reason)``:
        the first error, one line, without a password."""
        try:
            topo = self.get_topology()
            if self.publication is not None:
                topo.publication(self.publication)
            reached = []
            for loc, endpoint in topo.servers().items():
                role = str(loc[0]) if len(loc) == 1 else f"subscriber {loc[-1]}"
                conninfo = endpoint.require(role)
                with connections.connect(conninfo, role, autocommit=True, connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                reached.append(f"{role} ({connections.describe(conninfo)})")
        except ReplError as exc:
            return False, str(exc)
        except Exception as exc:  # a failure of a kind the engine does not name: its type and redacted text
            return False, redact(f"{type(exc).__name__}: {' '.join(str(exc).split())}")
        return True, f"topology {self.topology_path}: connected to {len(reached)} server(s): {', '.join(reached)}"

    @staticmethod
    def write_spec(topo: topology.Topology, directory: str | Path) -> Path:
        """Write the resolved topology (with passwords) to a 0600 file for a Spark job."""
        path = Path(directory) / "topology-spec.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(topo.to_dict(with_secrets=True), fh)
        return path
