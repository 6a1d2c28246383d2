"""MariaDB subscribers' connection strings, and connecting to them safely.

A MariaDB (or MySQL) server is named by a ``mariadb://`` or ``mysql://`` URI
(``mariadb://USER@HOST:3306/DATABASE?connect_timeout=5``, the password from the topology's
``${VAR}`` or the connection) or by an Airflow ``mysql`` connection id (``apache-airflow-providers-mysql``'s type).  Either resolves to one normalized
connection string (``mariadb://`` with the user, password, host, port, database and ``extra=<JSON>``): the URI's query
parameters or the connection's extras, checked here, are the driver's settings (PyMySQL's
keyword arguments), as a Postgres connection's extras are libpq's.

The string carries the password: it is never logged; :func:`describe` is the safe form, and
every message built from a driver's error goes through :func:`error_text`, which redacts it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from airflow_repl.engine.errors import ConnectionFailed, TopologyError, redact

if TYPE_CHECKING:  # the driver is imported by what connects: a PostgreSQL-only run never loads it
    import pymysql

SCHEMES = ("mariadb", "mysql")
DEFAULT_PORT = 3306

#: The extras (URI query parameters) that reach PyMySQL, and the type each takes.
DRIVER_EXTRAS: dict[str, type] = {
    "connect_timeout": int,
    "read_timeout": int,
    "write_timeout": int,
    "unix_socket": str,
    "local_infile": bool,
    "ssl": dict,
    "ssl_ca": str,
    "ssl_cert": str,
    "ssl_key": str,
    "ssl_verify_cert": bool,
    "ssl_verify_identity": bool,
    "ssl_disabled": bool,
    "charset": str,
}
#: The extras ``MySqlHook`` reads itself and never passes to the driver: dropped here too.
HOOK_ONLY_EXTRAS = frozenset({"cursor", "client", "iam", "aws_conn_id"})

#: Session settings of every connection: UTC (``timestamptz`` values arrive in UTC), strict
#: (a value that does not fit is an error, never a truncation), a 0 is a 0 in an
#: AUTO_INCREMENT column, and foreign keys not checked (SQL Server's NOT FOR REPLICATION:
#: the publisher checked them; its commit order is the subscriber's).
SESSION_SETTINGS = (
    "SET time_zone = '+00:00', "
    "sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
    "NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO', foreign_key_checks = 0, "
    "character_set_client = utf8mb4, character_set_results = utf8mb4, collation_connection = utf8mb4_nopad_bin"
)


def is_mariadb(conninfo_or_uri: str) -> bool:
    """Whether a connection string or URI names a MariaDB (MySQL) server."""
    return conninfo_or_uri.split("://", 1)[0].lower() in SCHEMES if "://" in conninfo_or_uri else False


def _typed(key: str, value: Any) -> Any:
    want = DRIVER_EXTRAS[key]
    if want is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, str)) and str(value).lower() in ("1", "0", "true", "false", "yes", "no"):
            return str(value).lower() in ("1", "true", "yes")
    elif want is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    elif want is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        if isinstance(value, dict) and all(isinstance(v, (str, bool)) for v in value.values()):
            return value
    elif isinstance(value, str):
        return value
    raise TopologyError(f"extra {key!r} must be a {want.__name__}, not {value!r:.40}")


def check_extras(extra: dict[str, Any]) -> dict[str, Any]:
    """The extras that reach the driver, checked; an unknown key is an error naming it."""
    out: dict[str, Any] = {}
    for key, value in extra.items():
        if key in HOOK_ONLY_EXTRAS:
            continue
        if key not in DRIVER_EXTRAS:
            raise TopologyError(
                f"extra {key!r} is not a setting of the MariaDB driver: remove it, or use one of "
                f"{', '.join(sorted(DRIVER_EXTRAS))}"
            )
        out[key] = _typed(key, value)
    if out.get("charset", "utf8mb4") != "utf8mb4":
        raise TopologyError(
            f"extra 'charset' is {out['charset']!r}: a MariaDB subscriber's text is utf8mb4 always; remove it"
        )
    out.pop("charset", None)
    return out


def conninfo_from_parts(
    host: str | None,
    port: int | None,
    login: str | None,
    password: str | None,
    database: str | None,
    extra: dict[str, Any] | None = None,
) -> str:
    """The normalized ``mariadb://`` connection string of an Airflow-style connection."""
    if not database:
        raise TopologyError(
            "a MariaDB subscriber's connection must name its database (the schema field, or the URI's path)"
        )
    kept = check_extras(extra or {})
    auth = quote(login or "", safe="")
    if password:
        auth += ":" + quote(password, safe="")
    query = f"?extra={quote(json.dumps(kept, sort_keys=True), safe='')}" if kept else ""
    where = host or "localhost"
    if ":" in where:
        where = f"[{where}]"
    return f"mariadb://{auth}@{where}:{port or DEFAULT_PORT}/{quote(database, safe='')}{query}"


def from_uri(uri: str) -> str:
    """A ``mariadb://`` or ``mysql://`` URI as the normalized connection string (its query
    parameters are the driver's settings)."""
    parts = urlsplit(uri)
    try:
        port = parts.port
    except ValueError:
        raise TopologyError(
            f"the connection URI for {parts.hostname or 'a server'} is malformed: its port is not a number from 0 to 65535"
        ) from None
    extra: dict[str, Any] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "extra":
            extra.update(json.loads(value))
        else:
            extra[key] = value
    return conninfo_from_parts(
        parts.hostname,
        port,
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password else None,
        unquote(parts.path.lstrip("/")) or None,
        extra,
    )


def connect_args(conninfo: str) -> dict[str, Any]:
    """PyMySQL's keyword arguments for a normalized connection string."""
    parts = urlsplit(conninfo)
    args: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": parts.port or DEFAULT_PORT,
        "user": unquote(parts.username or ""),
        # UTF-8 bytes: PyMySQL would encode a str as Latin-1 (a non-Latin-1 password failed inside
        # the driver, a Latin-1 one was refused), while the server hashed the password's UTF-8
        "password": unquote(parts.password or "").encode(),
        "database": unquote(parts.path.lstrip("/")),
        "charset": "utf8mb4",
        "autocommit": False,
        "connect_timeout": 10,
    }
    for key, value in parse_qsl(parts.query):
        if key == "extra":
            args.update(json.loads(value))
    return args


def database(conninfo: str) -> str:
    """The database a connection string names (where the subscriber's tables live)."""
    return unquote(urlsplit(conninfo).path.lstrip("/"))


def describe(conninfo: str) -> str:
    """``user@host:port/database``: no password, safe for logs and messages."""
    try:
        parts = urlsplit(conninfo)
        return f"{unquote(parts.username or '')}@{parts.hostname or 'localhost'}:{parts.port or DEFAULT_PORT}/{database(conninfo)}".lstrip(
            "@"
        )
    except ValueError:
        return "<mariadb server>"


def authority(conninfo: str) -> tuple[str, str]:
    """(``host:port``, database) of a connection string; never its password."""
    parts = urlsplit(conninfo)
    host = parts.hostname or "localhost"
    return f"{f'[{host}]' if ':' in host else host}:{parts.port or DEFAULT_PORT}", database(conninfo)


def connect(conninfo: str, role: str, **overrides: Any) -> pymysql.connections.Connection:
    """Connect with the session settings; an unreachable server or a refused login is one
    :class:`ConnectionFailed` line naming the server (without its password) and the fix."""
    import pymysql

    args = {**connect_args(conninfo), **overrides}
    try:
        conn = pymysql.connect(**args)
    except (pymysql.MySQLError, OSError) as exc:  # OSError: an unreadable ssl_ca file
        raise connect_failed(role, conninfo, exc) from None
    try:
        with conn.cursor() as cur:
            cur.execute(SESSION_SETTINGS)
    except pymysql.MySQLError as exc:
        conn.close()
        raise connect_failed(role, conninfo, exc) from None
    return conn


#: Client errors that mean the server went away (2003 cannot connect, 2006 gone, 2013 lost, 2055 lost).
LOST_CONNECTION = (2003, 2006, 2013, 2055)


def is_lost(exc: BaseException) -> bool:
    """Whether a driver error means the connection to the server is gone."""
    import pymysql

    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    return isinstance(exc, pymysql.err.InterfaceError) or (bool(args) and args[0] in LOST_CONNECTION)


def password(conninfo: str) -> str:
    """The password of a connection string ("" without one or when it does not parse)."""
    try:
        return unquote(urlsplit(conninfo).password or "")
    except ValueError:
        return ""


def error_text(exc: BaseException, conninfo: str | None = None) -> str:
    """The driver's error as one line, ``(code) message``, redacted: no connection string's
    password, nor the password of ``conninfo`` (as given or percent-encoded)."""
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    if len(args) >= 2:
        text = f"({args[0]}) {' '.join(str(args[1]).split())}"
    else:
        text = " ".join(str(exc).split()) or type(exc).__name__
    secret = password(conninfo) if conninfo else ""
    return redact(text, secret, quote(secret, safe=""))


def connect_failed(role: str, conninfo: str, exc: BaseException) -> ConnectionFailed:
    return ConnectionFailed(
        f"cannot connect to the {role} at {describe(conninfo)}: {error_text(exc, conninfo)}. Check that the MariaDB server "
        f"is running and that the connection's host, port, user, password and database are right."
    )
