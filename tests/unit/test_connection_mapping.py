"""An Airflow-style connection's parts -> libpq settings (``connections.conninfo_from_parts``), without
Airflow or a server: every extra that is a libpq parameter kept, the rest refused by name.  (The
Airflow side, ``PostgresHook``'s own keys and Airflow's lookup, is in
``tests/integration/test_connections.py``.)"""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.postgres import connections


def _params(extra=None, **parts) -> dict:
    fields = {"host": "db1", "port": 5433, "login": "repl", "password": "s3cret pw", "dbname": "shop", **parts}
    return conninfo_to_dict(connections.conninfo_from_parts(**fields, extra=extra))


def test_fields_become_libpq_keywords():
    assert _params() == {"host": "db1", "port": "5433", "user": "repl", "password": "s3cret pw", "dbname": "shop"}
    assert _params(host=None, port=None, login="", password=None) == {"dbname": "shop"}


def test_every_libpq_extra_is_kept():
    extra = {
        "application_name": "repl-agent",
        "target_session_attrs": "read-write",
        "options": "-c statement_timeout=5000",
        "sslmode": "disable",
        "connect_timeout": 7,
        "keepalives": True,
        "keepalives_idle": 30,
        "load_balance_hosts": "disable",
        "tcp_user_timeout": 1.5,
        "sslrootcert": None,  # null: left out, as libpq's default
    }
    got = _params(extra)
    assert {k: got[k] for k in extra if k != "sslrootcert"} == {
        "application_name": "repl-agent",
        "target_session_attrs": "read-write",
        "options": "-c statement_timeout=5000",
        "sslmode": "disable",
        "connect_timeout": "7",
        "keepalives": "1",  # a JSON boolean as libpq's 1/0
        "keepalives_idle": "30",
        "load_balance_hosts": "disable",
        "tcp_user_timeout": "1.5",
    }
    assert "sslrootcert" not in got


def test_an_extra_overrides_the_field_as_in_postgres_hook():
    assert _params({"dbname": "other", "host": "db2"})[("dbname")] == "other"
    assert _params({"dbname": "other", "host": "db2"})["host"] == "db2"


@pytest.mark.parametrize(
    "extra, says",
    [
        ({"aplication_name": "x"}, "extra 'aplication_name' is not a libpq connection parameter: remove it"),
        ({"cursor": "dictcursor"}, "extra 'cursor' is not a libpq connection parameter"),  # the hook drops it first
        ({"replication": "database"}, "extra 'replication' cannot be set on a replication server"),
        ({"options": ["-c", "x=1"]}, "extra 'options' must be a string or a number, not list"),
    ],
)
def test_a_bad_extra_is_refused_by_name(extra, says):
    with pytest.raises(TopologyError, match="^" + says.replace("(", r"\(")) as err:
        _params(extra)
    assert "s3cret" not in str(err.value)


def test_without_a_lookup_a_connection_id_names_the_airflow_resolver():
    with pytest.raises(TopologyError, match="connection id 'repl_pub' cannot be resolved without Airflow"):
        connections.resolve("repl_pub")
    assert conninfo_to_dict(connections.resolve("postgresql://u@h:5/d?application_name=a"))["application_name"] == "a"
