"""MariaDB subscribers without a server: the type map, value conversions, connection strings
and the topology's rules for them."""

from __future__ import annotations

import pytest

from airflow_repl.engine.errors import DeliveryError, TopologyError
from airflow_repl.engine.mariadb import connections, types
from airflow_repl.engine.mariadb.quoting import check_name, ident, literal
from airflow_repl.engine.model import topology


def test_a_driver_error_is_one_line_without_the_connections_password():
    info = connections.from_uri("mariadb://u:s3cr%C3%A9t%2F1@h:3306/shop")
    exc = Exception(1045, "Access denied\nfor 's3crét/1' (see mariadb://u:other@h/shop)")
    assert connections.error_text(exc, info) == "(1045) Access denied for '***' (see mariadb://u:***@h/shop)"
    assert "s3cr%C3%A9t%2F1" not in connections.error_text(Exception(f"dsn {info}"), info)
    message = str(connections.connect_failed("MariaDB subscriber 'm1'", info, Exception(2003, "s3crét/1 refused")))
    assert "s3crét" not in message and "MariaDB subscriber 'm1' at u@h:3306/shop" in message


@pytest.mark.parametrize(
    ("pg_type", "key", "ddl"),
    [
        ("integer", False, "INT"),
        ("bigint", True, "BIGINT"),
        ("numeric(12,3)", False, "DECIMAL(12,3)"),
        ("numeric(65,38)", False, "DECIMAL(65,38)"),
        ("timestamp with time zone", False, "DATETIME(6)"),
        ("timestamp(3) without time zone", False, "DATETIME(6)"),
        ("time without time zone", False, "TIME(6)"),
        ("text", False, f"LONGTEXT {types.TEXT}"),
        ("text", True, f"VARCHAR(768) {types.TEXT}"),
        ("character varying(20)", False, f"VARCHAR(20) {types.TEXT}"),
        ("character(3)", True, f"VARCHAR(3) {types.TEXT}"),
        ("bytea", True, "VARBINARY(3072)"),
        ("jsonb", False, "JSON"),
        ("uuid", True, f"CHAR(36) {types.TEXT}"),
        ("integer[]", False, f"LONGTEXT {types.TEXT}"),
        ("interval", False, f"VARCHAR(255) {types.TEXT}"),
    ],
)
def test_type_map(pg_type, key, ddl):
    assert types.map_type("t", "c", pg_type, key=key).ddl == ddl


def test_every_text_column_compares_byte_for_byte():
    assert "utf8mb4_nopad_bin" in types.TEXT and "utf8mb4" in types.TEXT


@pytest.mark.parametrize(
    ("pg_type", "key", "kind", "why"),
    [
        ("numeric", False, "b", "numeric without precision"),
        ("numeric(70,2)", False, "b", "at most 65 digits"),
        ("time with time zone", False, "b", "no MariaDB counterpart"),
        ("money", False, "b", "no MariaDB counterpart"),
        ("public.pair", False, "c", "composite"),
        ("jsonb", True, "b", "cannot be a key"),
        ("integer[]", True, "b", "cannot be keys"),
        ("character varying(1000)", True, "b", "at most 768 characters"),
    ],
)
def test_unmappable_types_are_refused_naming_column_and_type(pg_type, key, kind, why):
    with pytest.raises(TopologyError) as err:
        types.map_type("article 'a'", "col", pg_type, key=key, kind=kind)
    assert "column 'col'" in str(err.value) and pg_type in str(err.value) and why in str(err.value)


def test_enums_and_ranges_by_kind():
    assert types.map_type("t", "c", "public.mood", key=True, kind="e").ddl.startswith("VARCHAR(255)")
    assert types.map_type("t", "c", "floatrange", key=False, kind="r").ddl.startswith("LONGTEXT")


def test_a_key_of_two_text_columns_shares_innodbs_limit():
    assert types.map_type("t", "c", "text", key=True, key_bytes=1536).ddl.startswith("VARCHAR(384)")
    assert types.key_room("t", [[("a", None), ("b", None)]]) == {"a": 1536, "b": 1536}


def test_a_keys_other_columns_leave_its_text_and_bytes_columns_the_rest_of_innodbs_limit():
    # text + bytes + int: (3072 - 4) / 2 each; a text column in two keys gets the smaller share
    keys = [[("k", None), ("b", None), ("n", types.key_length("INT"))], [("k", None), ("d", 8)]]
    assert types.key_room("t", keys) == {"k": 1534, "b": 1534}
    assert types.map_type("t", "k", "text", key=True, key_bytes=1534).ddl.startswith("VARCHAR(383) ")
    assert types.map_type("t", "b", "bytea", key=True, key_bytes=1534).ddl == "VARBINARY(1534)"
    assert [types.key_length(d) for d in ("BIGINT", "DATE", "DATETIME(6)", "DECIMAL(30,10)", "DECIMAL(65,30)")] == [
        8,
        3,
        8,
        14,
        30,
    ]
    assert types.key_length(f"CHAR(36) {types.TEXT}") == 144 and types.key_length("VARBINARY(10)") == 10
    with pytest.raises(TopologyError, match=r"the key \('e1', 'e2', 'e3', 't'\) of t would take more than") as err:
        types.key_room("t", [[("e1", 1020), ("e2", 1020), ("e3", 1030), ("t", None)]])
    assert "\n" not in str(err.value)


def test_values_converted():
    assert types.to_param(types.BOOL, "t", "c", "t") is True
    assert types.to_param(types.BYTES, "\\x00ff", "c", "t") == b"\x00\xff"
    assert types.to_param(types.TIMESTAMPTZ, "2026-01-02 03:04:05.5+00", "c", "t") == "2026-01-02 03:04:05.5"
    assert types.to_param(types.TIMESTAMPTZ, "2026-01-02 03:04:05+05:30", "c", "t") == "2026-01-01 21:34:05.000000"
    assert types.to_param(types.AS_TEXT, "a\U0001f600", "c", "t") == "a\U0001f600"
    assert types.to_param(types.REAL, "3.4028235e+38", "c", "t") == 3.4028234663852886e38  # within FLOAT's range
    assert str(types.canonical(types.REAL, "real", -0.0)) == "0.0"  # MariaDB has no negative zero
    # arrays of times and numbers are compared as their text
    assert types.canonical(types.AS_TEXT, "timestamp with time zone[]", "{infinity}") == "{infinity}"
    assert types.canonical(types.AS_TEXT, "numeric[]", "{NaN,1.50}") == "{NaN,1.50}"
    assert types.canonical(types.AS_TEXT, "time without time zone[]", "{24:00:00}") == "{24:00:00}"
    for conversion, value in [
        (types.FLOAT, "NaN"),
        (types.REAL, "-Infinity"),
        (types.DATETIME, "infinity"),
        (types.DATETIME, "0044-03-15 BC"),
        (types.TIMESTAMPTZ, "0001-01-01 00:30:00+01"),  # year 0 in UTC
        (types.TIMESTAMPTZ, "9999-12-31 23:30:00-01"),  # year 10000 in UTC
    ]:
        with pytest.raises(DeliveryError, match="column 'c'"):
            types.to_param(conversion, value, "c", "t")


def test_quoting():
    assert ident("a`b") == "`a``b`"
    assert literal("it's") == "'it''s'"
    assert literal("it's \\ \0") == "CONVERT(X'69742773205C2000' USING utf8mb4)"  # no backslash escape
    with pytest.raises(TopologyError, match="64 characters"):
        check_name("column", "x" * 65, "t")
    with pytest.raises(TopologyError, match="trailing space"):
        check_name("column", "x ", "t")
    with pytest.raises(TopologyError, match="4-byte"):
        check_name("column", "x\U0001f600", "t")
    for end in " \t\n\v\f\r":
        with pytest.raises(TopologyError, match="trailing space, tab, line break") as err:
            check_name("column", "x" + end, "table " + repr("t\nx"))
        assert "\n" not in str(err.value) and repr("x" + end) in str(err.value)
    assert check_name("column", 'a "b"\n`c` ' + "\u00e9" * 30 + "x", "t")


def test_uri_and_connection_parts_normalized_without_losing_the_password():
    info = connections.from_uri("mysql://u%40x:p%2Fw@db.example:3307/shop?connect_timeout=5&ssl_ca=/ca.pem")
    assert info.startswith("mariadb://")
    args = connections.connect_args(info)
    assert (args["user"], args["password"], args["host"], args["port"], args["database"]) == (
        "u@x",
        b"p/w",  # UTF-8 bytes, as the server hashed it (PyMySQL encodes a str as Latin-1)
        "db.example",
        3307,
        "shop",
    )
    assert args["connect_timeout"] == 5 and args["ssl_ca"] == "/ca.pem"
    assert "p/w" not in connections.describe(info) and "p%2Fw" not in connections.describe(info)
    assert connections.describe(info) == "u@x@db.example:3307/shop"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"init_command": "DROP TABLE x"}, "not a setting of the MariaDB driver"),
        ({"charset": "latin1"}, "utf8mb4 always"),
        ({"connect_timeout": "soon"}, "must be a int"),
    ],
)
def test_bad_extras_are_refused(extra, message):
    with pytest.raises(TopologyError, match=message):
        connections.conninfo_from_parts("h", None, "u", "p", "db", extra)


def test_airflow_hook_only_extras_are_dropped():
    info = connections.conninfo_from_parts("h", None, "u", "p", "db", {"cursor": "dictcursor", "local_infile": True})
    assert connections.connect_args(info)["local_infile"] is True and "cursor" not in connections.connect_args(info)


def test_a_database_is_required():
    with pytest.raises(TopologyError, match="must name its database"):
        connections.from_uri("mariadb://u:p@h:3306/")


def _topology(**sub):
    return topology.from_dict(
        {
            "publisher": "postgresql://u@h/pub",
            "distributor": "postgresql://u@h/dist",
            "subscribers": {"m": "mariadb://u:secret@h:3306/db"},
            "publications": [{"name": "p", "articles": ["public.t"], "allow_sync_tran": True}],
            "subscriptions": [{"publication": "p", "subscriber": "m", **sub}],
        }
    )


def test_an_update_mode_on_a_mariadb_subscription_is_one_line():
    from airflow_repl.engine.postgres.connections import resolve_topology

    with pytest.raises(TopologyError) as err:
        resolve_topology(_topology(update_mode="sync tran"))
    assert "PostgreSQL-only" in str(err.value) and "secret" not in str(err.value)
    assert "\n" not in str(err.value)
    topo = resolve_topology(_topology())
    assert topo.is_mariadb_subscriber("m")
    assert topo.subscribers["m"].display == "u@h:3306/db"


def test_a_mariadb_publisher_is_refused():
    data = {
        "publisher": "mariadb://u:secret@h/pub",
        "distributor": "postgresql://u@h/dist",
        "subscribers": {"m": "mariadb://u:secret@h:3306/db"},
        "publications": [{"name": "p", "articles": ["public.t"]}],
    }
    with pytest.raises(TopologyError, match="MariaDB server cannot be the publisher") as err:
        topology.from_dict(data)
    assert "secret" not in str(err.value)
