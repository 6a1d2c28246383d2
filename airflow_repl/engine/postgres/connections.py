"""Resolving the servers a topology names, and connecting to them safely.

A server is named either by an Airflow connection id (``repl_publisher``) or by a plain
``postgresql://`` URI (handy for the sandbox).  The engine does not import Airflow: connection
ids are resolved through a *resolver* callable.  The default resolver reads the same
``AIRFLOW_CONN_<ID>`` environment variables Airflow itself honours; the Airflow hook passes a
resolver backed by Airflow's connection store.

Connection strings carry passwords, so they are never logged: use :func:`describe` for messages.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import psycopg
from psycopg import conninfo as pg_conninfo

from airflow_repl.engine.errors import ConnectionFailed, TopologyError
from airflow_repl.engine.model.topology import Topology, is_uri

Resolver = Callable[[str], str]


def conninfo_from_parts(
    host: str | None,
    port: int | None,
    login: str | None,
    password: str | None,
    dbname: str | None,
    extra: dict[str, Any] | None = None,
) -> str:
    """A libpq key/value connection string from the parts of an Airflow-style connection."""
    params: dict[str, str | int] = {}
    if host:
        params["host"] = host
    if port:
        params["port"] = port
    if login:
        params["user"] = login
    if password:
        params["password"] = password
    if dbname:
        params["dbname"] = dbname
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "options"):
        if extra and key in extra:
            params[key] = extra[key]
    return pg_conninfo.make_conninfo("", **params)


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


def _malformed(var: str, why: str) -> TopologyError:
    return TopologyError(
        f"the connection in environment variable {var} is malformed: {why}; give a "
        f"postgresql://user:password@host:port/dbname URI or Airflow's JSON form "
        f'{{"conn_type": "postgres", "host": ..., "port": 5432, "login": ..., '
        f'"password": ..., "schema": <database>}}'
    )


def _json_connection(var: str, value: str) -> str:
    """Airflow's JSON connection form, every field checked (the value itself is never quoted:
    it holds the password)."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise _malformed(var, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if not isinstance(data, dict):
        raise _malformed(var, f"the JSON is a {type(data).__name__}, not an object")
    for key in ("host", "login", "password", "schema", "conn_type"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise _malformed(var, f"{key!r} must be a string, not {type(data[key]).__name__}")
    port = data.get("port")
    if port is not None and (isinstance(port, bool) or not str(port).isdigit() or not 0 < int(port) < 65536):
        raise _malformed(var, "'port' must be a number from 1 to 65535")
    extra = data.get("extra")
    if isinstance(extra, str):  # Airflow allows extra as a JSON string too
        try:
            extra = json.loads(extra) if extra.strip() else None
        except json.JSONDecodeError as exc:
            raise _malformed(var, f"'extra' is not valid JSON ({exc.msg})") from None
    if extra is not None and not isinstance(extra, dict):
        raise _malformed(var, "'extra' must be an object")
    return conninfo_from_parts(
        data.get("host"),
        int(port) if port is not None else None,
        data.get("login"),
        data.get("password"),
        data.get("schema"),
        extra,
    )


def env_resolver(conn_id: str) -> str:
    """Resolve an Airflow connection id from ``AIRFLOW_CONN_<ID>`` (URI or JSON form)."""
    var = f"AIRFLOW_CONN_{conn_id.upper()}"
    value = os.environ.get(var)
    if value is None:
        raise TopologyError(
            f"connection id {conn_id!r} is not defined: set the environment variable {var} "
            f"(or run through Airflow, which resolves its own connections)"
        )
    value = value.strip()
    if value.startswith("{"):
        return _json_connection(var, value)
    parts = urlsplit(value)
    if parts.scheme in ("postgresql", "postgres"):
        try:
            return _uri_to_conninfo(value)
        except TopologyError as exc:
            raise _malformed(
                var, str(exc).split(" is malformed", 1)[-1].lstrip(": ") or "the URI cannot be parsed"
            ) from None
    if not parts.scheme or not parts.netloc:
        raise _malformed(var, "it is neither a URI nor a JSON object")
    # Airflow URI form: postgres://login:password@host:port/schema
    try:
        port = parts.port
    except ValueError:
        raise _malformed(var, "the URI's port is not a number from 0 to 65535") from None
    return conninfo_from_parts(
        parts.hostname,
        port,
        unquote(parts.username or "") or None,
        unquote(parts.password or "") or None,
        parts.path.lstrip("/") or None,
    )


_SECRET_PATTERNS = (
    re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE),
    re.compile(r"(://[^:/@\s]*:)[^@\s]*(@)"),
)


def redact(text: str) -> str:
    """``text`` with passwords of connection strings and URIs replaced by ``***`` (a last line
    of defence for messages built from foreign exceptions)."""
    text = _SECRET_PATTERNS[0].sub(r"\1***", text)
    return _SECRET_PATTERNS[1].sub(r"\1***\2", text)


def resolve(ref: str, resolver: Resolver | None = None) -> str:
    """Turn a connection reference (URI or connection id) into a libpq connection string."""
    if is_uri(ref):
        return _uri_to_conninfo(ref)
    return (resolver or env_resolver)(ref)


def resolve_topology(topology: Topology, lookup: Resolver | None = None) -> Topology:
    """Resolve every server of ``topology`` (in place): URIs directly, connection ids through
    ``lookup`` (default: the ``AIRFLOW_CONN_<ID>`` environment variables)."""
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


def connect(conninfo: str, role: str, *, autocommit: bool = False, **kwargs: Any) -> psycopg.Connection:
    """Connect, turning an unreachable server into an error that names it and the fix."""
    try:
        return psycopg.connect(with_session_settings(conninfo), autocommit=autocommit, connect_timeout=10, **kwargs)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConnectionFailed(
            f"cannot connect to the {role} at {describe(conninfo)}: {first}. "
            f"Check that the server is running and that the connection's host, port, "
            f"user, password and database are right."
        ) from None
