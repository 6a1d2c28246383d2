"""Where a table lives, named the way Airflow assets and OpenLineage name PostgreSQL tables.

* Airflow asset URI (the Postgres provider's ``postgres://`` scheme, as its ``sanitize_uri``
  normalises it): ``postgres://host:port/database/schema/table``;
* OpenLineage dataset (its naming spec for PostgreSQL): namespace ``postgres://host:port``,
  name ``database.schema.table``.

The host, port and database are those of the server's connection string as written (no DNS
lookup, no password, no user): the first host of a multi-host string, ``localhost`` for a Unix
socket or no host, an IPv6 address in brackets, port 5432 when none is given.  Path components of the URI are
percent-encoded, so that a ``/`` or a space in an identifier cannot change its shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

import psycopg
from psycopg import conninfo as pg_conninfo

from airflow_repl.engine.errors import TopologyError


@dataclass(frozen=True)
class TableAddress:
    """A table on a server: ``host:port``, database, schema and table name."""

    authority: str  # host:port
    database: str
    schema: str
    table: str

    @property
    def uri(self) -> str:
        """The Airflow asset URI: ``postgres://host:port/database/schema/table``."""
        path = "/".join(quote(part, safe="") for part in (self.database, self.schema, self.table))
        return f"postgres://{self.authority}/{path}"

    @property
    def namespace(self) -> str:
        """The OpenLineage dataset namespace: ``postgres://host:port``."""
        return f"postgres://{self.authority}"

    @property
    def name(self) -> str:
        """The OpenLineage dataset name: ``database.schema.table``."""
        return f"{self.database}.{self.schema}.{self.table}"


def authority(conninfo: str) -> tuple[str, str]:
    """(``host:port``, database) of a connection string or URI; never its password."""
    try:
        params = pg_conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        raise TopologyError("a server's connection string cannot be parsed: fix its connection") from None
    host = str(params.get("host") or "").split(",")[0]
    if not host or host.startswith("/") or host.startswith("@"):
        host = "localhost"  # a Unix socket: the server is on this machine
    port = str(params.get("port") or "").split(",")[0] or "5432"
    database = str(params.get("dbname") or params.get("user") or "postgres")
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    return f"{host}:{port}", database


def table_address(conninfo: str, qualified_table: str) -> TableAddress:
    """The address of ``schema.table`` (the topology's form) on the server of ``conninfo``."""
    schema, table = qualified_table.split(".", 1)
    where, database = authority(conninfo)
    return TableAddress(where, database, schema, table)
