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
from typing import Callable
from urllib.parse import quote, unquote, urlsplit

import psycopg
from psycopg import conninfo as pg_conninfo

from .errors import ConnectionFailed, TopologyError

Resolver = Callable[[str], str]


def is_uri(ref: str) -> bool:
    return "://" in ref


def conninfo_from_parts(host: str | None, port: int | None, login: str | None, password: str | None,
                        dbname: str | None, extra: dict | None = None) -> str:
    """A libpq key/value connection string from the parts of an Airflow-style connection."""
    params: dict[str, object] = {}
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
    return pg_conninfo.make_conninfo(**params)


def _uri_to_conninfo(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.scheme not in ("postgresql", "postgres"):
        raise TopologyError(
            f"connection URI scheme {parts.scheme!r} is not supported; use postgresql://user@host:port/dbname")
    # libpq parses postgresql:// URIs itself; normalise to key/value so describe() works.
    try:
        return pg_conninfo.make_conninfo(uri.replace("postgres://", "postgresql://", 1)
                                         if parts.scheme == "postgres" else uri)
    except psycopg.ProgrammingError:  # its message may quote the password: never pass it on
        raise TopologyError(f"the connection URI for {parts.hostname or 'a server'} is malformed (check the "
                            f"percent-encoding of the user name and password)") from None


def env_resolver(conn_id: str) -> str:
    """Resolve an Airflow connection id from ``AIRFLOW_CONN_<ID>`` (URI or JSON form)."""
    var = f"AIRFLOW_CONN_{conn_id.upper()}"
    value = os.environ.get(var)
    if value is None:
        raise TopologyError(
            f"connection id {conn_id!r} is not defined: set the environment variable {var} "
            f"(or run through Airflow, which resolves its own connections)")
    value = value.strip()
    if value.startswith("{"):
        data = json.loads(value)
        extra = data.get("extra")
        if isinstance(extra, str):  # Airflow allows extra as a JSON string too
            extra = json.loads(extra) if extra.strip() else None
        return conninfo_from_parts(data.get("host"), data.get("port"), data.get("login"),
                                   data.get("password"), data.get("schema"), extra)
    parts = urlsplit(value)
    if parts.scheme in ("postgresql", "postgres"):
        return _uri_to_conninfo(value)
    # Airflow URI form: postgres://login:password@host:port/schema
    return conninfo_from_parts(parts.hostname, parts.port, unquote(parts.username or "") or None,
                               unquote(parts.password or "") or None, parts.path.lstrip("/") or None)


def resolve(ref: str, resolver: Resolver | None = None) -> str:
    """Turn a connection reference (URI or connection id) into a libpq connection string."""
    if is_uri(ref):
        return _uri_to_conninfo(ref)
    return (resolver or env_resolver)(ref)


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
SESSION_SETTINGS = {"DateStyle": "ISO", "IntervalStyle": "postgres", "extra_float_digits": "3",
                    "TimeZone": "UTC", "bytea_output": "hex", "standard_conforming_strings": "on"}


def with_session_settings(conninfo: str) -> str:
    """The connection string with :data:`SESSION_SETTINGS` added to its ``options``."""
    options = pg_conninfo.conninfo_to_dict(conninfo).get("options") or ""
    pinned = " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())
    return pg_conninfo.make_conninfo(conninfo, options=f"{options} {pinned}".strip())


def connect(conninfo: str, role: str, *, autocommit: bool = False, **kwargs) -> psycopg.Connection:
    """Connect, turning an unreachable server into an error that names it and the fix."""
    try:
        return psycopg.connect(with_session_settings(conninfo), autocommit=autocommit, connect_timeout=10,
                               **kwargs)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConnectionFailed(
            f"cannot connect to the {role} at {describe(conninfo)}: {first}. "
            f"Check that the server is running and that the connection's host, port, "
            f"user, password and database are right.") from None
