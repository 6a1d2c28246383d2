"""Resolving the servers a topology names, and connecting to them safely.

A server is named either by an Airflow connection id (``repl_publisher``) or by a plain
``postgresql://`` URI (handy for the sandbox).  The engine does not import Airflow: connection
ids are resolved through a *resolver* callable, which the Airflow layer supplies
(:mod:`airflow_repl.hooks.connections`: Airflow's own lookup, turned into libpq settings the way
``PostgresHook`` does, through :func:`conninfo_from_parts`).

Connection strings carry passwords, so they are never logged: use :func:`describe` for messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg import pq

from airflow_repl.engine.errors import ConnectionFailed, ReplError, TopologyError
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.model.topology import Topology, is_mariadb, is_uri

Resolver = Callable[[str], str]


def _echo_of_an_earlier_error(record: logging.LogRecord) -> bool:
    """psycopg's warning that ending a pipeline failed after a statement in it had failed: the
    statement's own error, which the caller reports, says it all (kept at DEBUG level)."""
    return not record.getMessage().startswith("error ignored terminating") or logging.getLogger("psycopg").isEnabledFor(
        logging.DEBUG
    )


logging.getLogger("psycopg").addFilter(_echo_of_an_earlier_error)


#: libpq parameters the agents set themselves: an Airflow connection's extra may not set them.
ENGINE_OWNED_PARAMETERS = frozenset({"replication"})


def libpq_parameters() -> frozenset[str]:
    """The connection parameters the libpq in use knows (``application_name``, ``sslmode``, ...)."""
    return frozenset(d.keyword.decode() for d in pq.Conninfo.get_defaults())


def _libpq_value(key: str, value: Any) -> str | int | None:
    """An extra's value as libpq takes it: JSON booleans as 1/0 (``keepalives``), numbers and strings as they are."""
    if isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return str(value)
    raise TopologyError(f"extra {key!r} must be a string or a number, not {type(value).__name__}")


def conninfo_from_parts(
    host: str | None,
    port: int | None,
    login: str | None,
    password: str | None,
    dbname: str | None,
    extra: dict[str, Any] | None = None,
) -> str:
    """A libpq key/value connection string from the parts of an Airflow-style connection.

    Every entry of ``extra`` is a libpq parameter passed on as it is (``application_name``,
    ``target_session_attrs``, ``options``, ``sslmode``, ...), overriding the fields, as
    ``PostgresHook.get_conn`` does; the caller drops the extras that are not libpq parameters
    (the hook's own keys).  An unknown key is an error naming it, not a failure to connect."""
    params: dict[str, str | int | None] = {"host": host, "port": port, "user": login, "password": password}
    params["dbname"] = dbname
    known = libpq_parameters()
    for key, value in (extra or {}).items():
        if key in ENGINE_OWNED_PARAMETERS:
            raise TopologyError(f"extra {key!r} cannot be set on a replication server: the agents set it themselves")
        if key not in known:
            raise TopologyError(
                f"extra {key!r} is not a libpq connection parameter: remove it, or use one of the libpq "
                f"parameters (e.g. application_name, sslmode, target_session_attrs, options)"
            )
        params[key] = _libpq_value(key, value)
    return pg_conninfo.make_conninfo("", **{k: v for k, v in params.items() if v is not None and v != ""})


def _uri_to_conninfo(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.scheme not in ("postgresql", "postgres"):
        raise TopologyError(
            f"connection URI scheme {parts.scheme!r} is not supported; use postgresql://user@host:port/dbname"
        )
    try:
        _ = parts.port  # raises ValueError when the port is not a number
    except ValueError:
        raise TopologyError(
            f"the connection URI for {parts.hostname or 'a server'} is malformed: its port is "
            f"not a number from 0 to 65535"
        ) from None
    # libpq parses postgresql:// URIs itself; normalise to key/value so describe() works.
    try:
        return pg_conninfo.make_conninfo(
            uri.replace("postgres://", "postgresql://", 1) if parts.scheme == "postgres" else uri
        )
    except psycopg.ProgrammingError:  # its message may quote the password: never pass it on
        raise TopologyError(
            f"the connection URI for {parts.hostname or 'a server'} is malformed: check the "
            f"percent-encoding of the user name and password"
        ) from None


def _no_lookup(conn_id: str) -> str:
    raise TopologyError(
        f"connection id {conn_id!r} cannot be resolved without Airflow: resolve the topology with "
        f"airflow_repl.hooks.connections.resolve_topology (Airflow's connection lookup) or give a postgresql:// URI"
    )


def resolve(ref: str, resolver: Resolver | None = None) -> str:
    """Turn a connection reference (URI or connection id) into a libpq connection string."""
    if is_mariadb(ref):
        return mariadb_connections.from_uri(ref)
    if is_uri(ref):
        return _uri_to_conninfo(ref)
    return (resolver or _no_lookup)(ref)


def resolve_topology(topology: Topology, lookup: Resolver | None = None) -> Topology:
    """Resolve every server of ``topology`` (in place): URIs directly, connection ids through
    ``lookup``.  The engine does not import Airflow, so without a ``lookup`` a connection id is an
    error; :func:`airflow_repl.hooks.connections.resolve_topology` passes Airflow's lookup."""
    return topology.resolve(lambda ref: resolve(ref, lookup))


def describe(conninfo: str) -> str:
    """A password-free description of a connection string, safe for logs and messages."""
    try:
        params = pg_conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "<unparseable connection string>"
    host = params.get("host", "localhost")
    port = params.get("port", "5432")
    return f"{params.get('user', '')}@{host}:{port}/{params.get('dbname', '')}".lstrip("@")


def to_uri(conninfo: str) -> str:
    """A postgresql:// URI for the connection (used to hand sandbox servers to Airflow)."""
    p = pg_conninfo.conninfo_to_dict(conninfo)
    auth = quote(str(p.get("user", "")), safe="")
    if p.get("password"):
        auth += ":" + quote(str(p["password"]), safe="")
    return f"postgresql://{auth}@{p.get('host', 'localhost')}:{p.get('port', 5432)}/{p.get('dbname', '')}"


#: Session settings of every agent connection.  Values travel between servers in PostgreSQL's
#: text form, which depends on these; pinning them makes that form the same everywhere.
#: ``client_encoding``: every text (query results, COPY, and the pgoutput messages the Log Reader
#: decodes) reaches us in UTF8 whatever the database's encoding; the server converts.
#: ``search_path``: an unqualified name means the same at every server (built-ins first, then
#: public); the engine's own SQL qualifies everything else, and catalog reads of types use
#: pg_catalog alone (see catalog.catalog_search_path) so scripted types are always qualified.
SESSION_SETTINGS = {
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "TimeZone": "UTC",
    "bytea_output": "hex",
    "standard_conforming_strings": "on",
    "client_encoding": "UTF8",
    "search_path": "pg_catalog,public",
    "xmloption": "content",
    "array_nulls": "on",
}


def with_session_settings(conninfo: str) -> str:
    """The connection string with :data:`SESSION_SETTINGS` added to its ``options``."""
    options = pg_conninfo.conninfo_to_dict(conninfo).get("options") or ""
    pinned = " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())
    return pg_conninfo.make_conninfo(conninfo, options=f"{options} {pinned}".strip())


def connect(
    conninfo: str, role: str, *, autocommit: bool = False, connect_timeout: int = 10, **kwargs: Any
) -> psycopg.Connection:
    """Connect, turning an unreachable server into an error that names it and the fix
    (``connect_timeout``: seconds, at least 2, as libpq counts them)."""
    if is_mariadb(conninfo):  # never handed to libpq, whose error would quote it (password and all)
        raise ReplError(
            f"the {role} at {mariadb_connections.describe(conninfo)} is a MariaDB server, which this command does not "
            f"support yet (docs/subscribers-mariadb.md lists what MariaDB subscribers have)"
        )
    try:
        return psycopg.connect(
            with_session_settings(conninfo), autocommit=autocommit, connect_timeout=connect_timeout, **kwargs
        )
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise connect_failed(role, conninfo, first) from None


def connect_failed(role: str, conninfo: str, detail: str) -> ConnectionFailed:
    """The one-line error for a server that cannot be reached (``detail``: the driver's first line),
    naming the server without its password, and the fix."""
    return ConnectionFailed(
        f"cannot connect to the {role} at {describe(conninfo)}: {detail}. "
        f"Check that the server is running and that the connection's host, port, "
        f"user, password and database are right."
    )
