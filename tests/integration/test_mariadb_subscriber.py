"""A MariaDB subscriber, end to end with real servers: the snapshot by the type map, delivery
through SQL statements with the watermark in the same InnoDB transaction, crashes and
restarts mid-batch, keys that differ only in case, and each bad input refused with one line."""

from __future__ import annotations

import json
import logging
import re
import secrets
from datetime import date, datetime, timedelta
from urllib.parse import quote

import psycopg
import pytest
from harness import (
    AgentThread,
    assert_applied_once,
    backlog,
    deliver,
    mariadb_topology,
    resolved_topology,
    run_agent_process,
    spec_file,
    topology_file,
    unused_port,
    wait_for,
)

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import (
    AgentBusy,
    ConnectionFailed,
    ConnectionLost,
    DeliveryError,
    ReplError,
    TopologyError,
)
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.model import topology as topology_mod
from airflow_repl.engine.postgres.lsn import lsn_to_int
from airflow_repl.engine.subscriber import validation


def test_snapshot_then_changes_reach_a_mariadb_subscriber_exactly_once(env, spark, mariadb):
    env.run(
        env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text, n numeric(10,2), at timestamptz, ok boolean, b bytea)"
    )
    env.run(
        env.pub,
        "INSERT INTO items SELECT g, 'v' || g, g * 1.5, '2026-01-02 03:04:05+02', g % 2 = 0, '\\x00ff' FROM generate_series(1, 50) g",
    )
    topo, db = mariadb_topology(env, mariadb, ["public.items"])
    summary = snapshot_agent.run_snapshot(topo, "p", spark)
    assert summary["initialized"] == ["m1"]
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(50,)]
    assert mariadb.rows(db, "SELECT v, n, at, ok, b FROM items WHERE id = 2")[0][1:] == (
        __import__("decimal").Decimal("3.00"),
        __import__("datetime").datetime(2026, 1, 2, 1, 4, 5),
        1,
        b"\x00\xff",
    )
    env.run(env.pub, "UPDATE items SET v = 'changed' WHERE id <= 10")
    env.run(env.pub, "DELETE FROM items WHERE id > 40")
    env.run(env.pub, "INSERT INTO items (id, v) VALUES (100, 'new')")
    env.run(env.pub, "UPDATE items SET id = 200 WHERE id = 1")  # a key change: DELETE + INSERT
    done = deliver(topo)
    assert done["transactions"] == 4
    assert mariadb.rows(db, "SELECT COUNT(*), SUM(v = 'changed') FROM items") == [(41, 10)]
    assert mariadb.rows(db, "SELECT id FROM items WHERE id IN (1, 200)") == [(200,)]
    again = deliver(topo)
    assert again["transactions"] == 0
    [(watermark,)] = mariadb.rows(db, "SELECT xact_seqno FROM airflow_repl_subscription_state WHERE publication = 'p'")
    assert watermark == done["last_xact_seqno"]


# ---------------------------------------------------------------------- crashes: exactly once


def pause_at_row(mariadb, db, row_id: int, seconds: int) -> None:
    """A trigger that holds the batch inserting row ``row_id`` for ``seconds`` (its earlier rows
    open and uncommitted), so a test can kill or crash in the middle of that batch however fast
    the machine is."""
    mariadb.run(
        db,
        f"CREATE TRIGGER pause_batch BEFORE INSERT ON items FOR EACH ROW "
        f"BEGIN IF NEW.id = {row_id} THEN DO SLEEP({seconds}); END IF; END",
    )


def paused(mariadb) -> bool:
    """Whether a batch is held by :func:`pause_at_row` now."""
    [(n,)] = mariadb.rows("mysql", "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User sleep'")
    return int(n) > 0


def test_a_backlog_delivered_in_commit_order_batch_by_batch(env, spark, mariadb):
    topo, db = backlog(env, mariadb, spark, 2000, commit_batch_size=50)
    done = distribution_agent.run_distribution(topo, "p", "m1")
    assert done["transactions"] == 2000 and done["commits"] == 40
    assert_applied_once(mariadb, db, 2000)


@pytest.mark.parametrize(
    ("article", "mode"),
    [
        ("public.items", "auto"),
        ({"table": "public.items", "ins_cmd": "CALL sp_MSins_publicitems"}, "auto"),
        ("public.items", "net_change"),
    ],
    ids=["statements", "generated procedure", "net change"],
)
def test_distribution_agent_killed_mid_batch_applies_everything_exactly_once(
    env, spark, mariadb, tmp_path, article, mode
):
    """(Under ``auto`` the tables' triggers send the batches statement by statement; ``net_change``
    applies them by net change, the triggers seeing the net rows.)"""
    topo, db = backlog(
        env, mariadb, spark, 4000, article, commit_batch_size=1000, commit_batch_threshold=5000, apply_mode=mode
    )
    pause_at_row(mariadb, db, 5600, 5)  # the second batch, 600 rows in
    spec = spec_file(topo, tmp_path)
    outcome = run_agent_process("distribution", spec, {"subscriber": "m1"}, kill_when=lambda: paused(mariadb))
    assert outcome.killed, outcome
    mariadb.run(db, "DROP TRIGGER pause_batch")  # once the killed session's statement has ended
    [(before,)] = mariadb.rows(db, "SELECT COUNT(*) FROM items")
    assert before % 5000 == 0 and before < 20000  # whole batches only
    again = distribution_agent.run_distribution(topo, "p", "m1")
    assert again["transactions"] == 4000 - before // 5
    assert again.get("net_batches", 0) == (again["commits"] if mode == "net_change" else 0)
    assert_applied_once(mariadb, db, 4000)


def test_mariadb_restart_mid_batch_applies_everything_exactly_once(env, spark, mariadb):
    topo, db = backlog(env, mariadb, spark, 4000, commit_batch_size=1000, commit_batch_threshold=5000)
    pause_at_row(mariadb, db, 5600, 30)  # the second batch, 600 rows in
    agent = AgentThread(distribution_agent.run_distribution, topo, "p", "m1")
    agent.start()
    assert wait_for(lambda: paused(mariadb), 120) is not None
    mariadb.restart(kill=True)  # a crash of the server: InnoDB rolls the open batch back
    agent.join(120)
    mariadb.run(db, "DROP TRIGGER pause_batch")
    assert isinstance(agent.error, ConnectionLost), agent.error
    assert "\n" not in str(agent.error) and mariadb.server.password not in str(agent.error)
    distribution_agent.run_distribution(topo, "p", "m1")
    assert_applied_once(mariadb, db, 4000)


# ---------------------------------------------------------------------- keys and errors
def test_keys_that_differ_only_in_case_stay_distinct(env, spark, mariadb):
    env.run(env.pub, "CREATE TABLE k (k text PRIMARY KEY, u varchar(10) UNIQUE, v int)")
    env.run(env.pub, "INSERT INTO k VALUES ('a', 'x', 1), ('A', 'X', 2), ('\u00e4', 'y', 3)")
    topo, db = mariadb_topology(env, mariadb, ["public.k"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "INSERT INTO k VALUES ('\u00c4', 'Y', 4), ('a ', 'x ', 5)")
    env.run(env.pub, "UPDATE k SET v = 10 WHERE k = 'A'")
    env.run(env.pub, "DELETE FROM k WHERE k = 'a'")
    deliver(topo)
    assert sorted(mariadb.rows(db, "SELECT k, u, v FROM k")) == sorted(
        [("A", "X", 10), ("\u00e4", "y", 3), ("\u00c4", "Y", 4), ("a ", "x ", 5)]
    )


def test_row_not_found_stops_delivery_or_is_skipped(env, spark, mariadb):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items VALUES (1, 'a'), (2, 'b')")
    topo, db = mariadb_topology(env, mariadb, ["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    mariadb.run(db, "DELETE FROM items WHERE id = 1")
    env.run(env.pub, "INSERT INTO items VALUES (3, 'c')")
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id = 1")
    env.run(env.pub, "INSERT INTO items VALUES (4, 'd')")
    with pytest.raises(DeliveryError) as err:
        deliver(topo)
    assert "row not found" in str(err.value) and "key (id=1)" in str(err.value) and "\n" not in str(err.value)
    assert sorted(mariadb.rows(db, "SELECT id FROM items")) == [(2,), (3,)]  # what came before it committed
    done = distribution_agent.run_distribution(topo, "p", "m1", skip_errors=["20598"])
    assert done["skipped"] == 1
    assert sorted(mariadb.rows(db, "SELECT id, v FROM items")) == [(2, "b"), (3, "c"), (4, "d")]


def test_row_and_column_filters_and_none(env, spark, mariadb):
    env.run(env.pub, "CREATE TABLE f (id int PRIMARY KEY, region text, secret text, v int)")
    env.run(env.pub, "INSERT INTO f VALUES (1, 'eu', 's', 1), (2, 'us', 's', 2)")
    articles = [
        {"table": "public.f", "row_filter": "region = 'eu'", "columns": ["id", "region", "v"], "del_cmd": "NONE"}
    ]
    topo, db = mariadb_topology(env, mariadb, articles)
    snapshot_agent.run_snapshot(topo, "p", spark)
    assert [r[0] for r in mariadb.rows(db, "SHOW COLUMNS FROM f")] == ["id", "region", "v"]
    env.run(env.pub, "INSERT INTO f VALUES (3, 'eu', 's', 3), (4, 'us', 's', 4)")
    env.run(env.pub, "UPDATE f SET v = 10 WHERE id = 1")
    env.run(env.pub, "DELETE FROM f WHERE id = 3")  # NONE: not applied
    deliver(topo)
    assert sorted(mariadb.rows(db, "SELECT id, region, v FROM f")) == [(1, "eu", 10), (3, "eu", 3)]


# ---------------------------------------------------------------------- bad input: one line, nothing changed
def publications(env) -> int:
    [(n,)] = env.rows(env.pub, "SELECT count(*) FROM pg_catalog.pg_publication")
    return n


@pytest.mark.parametrize("fault", ["unreachable", "wrong password"])
def test_an_unreachable_mariadb_or_a_wrong_password_is_one_line_and_changes_nothing(env, spark, mariadb, fault):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    db = mariadb.new_database()
    uri = mariadb.uri(db)
    if fault == "unreachable":
        uri = uri.replace(f":{mariadb.server.port}/", f":{unused_port()}/")
    else:
        uri = uri.replace(f":{quote(mariadb.server.password, safe='')}@", ":wrong-password@")
    servers = env.servers(subscribers=[])
    servers["subscribers"] = {"m1": uri}
    topo = resolved_topology(
        {
            **servers,
            "publications": [{"name": "p", "articles": ["public.items"]}],
            "subscriptions": [{"publication": "p", "subscriber": "m1"}],
        }
    )
    with pytest.raises(ConnectionFailed) as err:
        snapshot_agent.run_snapshot(topo, "p", spark)
    message = str(err.value)
    assert "MariaDB subscriber 'm1'" in message and "\n" not in message
    assert mariadb.server.password not in message and "wrong-password" not in message
    assert ("Access denied" in message) == (fault == "wrong password")
    assert publications(env) == 0 and mariadb.rows(db, "SHOW TABLES") == []


# ---------------------------------------------------------------------- passwords: used, never shown
def distinctive_password() -> str:
    """Random, non-ASCII (beyond Latin-1 too), with every URI delimiter."""
    return f"Pw€{secrets.token_hex(8)}ü:@/ ?#%"


def mariadb_user(mariadb, db: str, password: str) -> str:
    """A user of database ``db`` with ``password``; its URI."""
    user = f"u{secrets.token_hex(4)}"
    with mariadb.server.connection() as conn, conn.cursor() as cur:
        cur.execute("CREATE USER %s@'127.0.0.1' IDENTIFIED BY %s", (user, password))
        cur.execute(f"GRANT ALL PRIVILEGES ON `{db}`.* TO %s@'127.0.0.1'", (user,))
    return f"mariadb://{user}:{quote(password, safe='')}@127.0.0.1:{mariadb.server.port}/{db}"


def items_topology(env, uri: str):
    """Publication ``p`` of public.items to MariaDB subscriber ``m1`` at ``uri``."""
    servers = env.servers(subscribers=[])
    servers["subscribers"] = {"m1": uri}
    return resolved_topology(
        {
            **servers,
            "publications": [{"name": "p", "articles": ["public.items"]}],
            "subscriptions": [{"publication": "p", "subscriber": "m1"}],
        }
    )


def test_a_password_beyond_latin_1_with_uri_delimiters_connects(env, spark, mariadb):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items VALUES (1, 'a')")
    db = mariadb.new_database()
    topo = items_topology(env, mariadb_user(mariadb, db, distinctive_password()))
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "INSERT INTO items VALUES (2, 'b')")
    deliver(topo)
    assert mariadb.rows(db, "SELECT id, v FROM items ORDER BY id") == [(1, "a"), (2, "b")]


@pytest.mark.parametrize("fault", ["wrong password", "unreachable", "unknown database"])
def test_a_mariadb_connection_failure_never_shows_the_password(env, spark, mariadb, tmp_path, capsys, caplog, fault):
    """Through the engine and the command line: the line names the subscriber and the fix, and
    neither it, the output, the history and error rows nor the log holds the password."""
    from airflow_repl import cli

    caplog.set_level(logging.DEBUG)
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    db = mariadb.new_database()
    password = distinctive_password()
    good = mariadb_user(mariadb, db, password)
    snapshot_agent.run_snapshot(items_topology(env, good), "p", spark)
    env.run(env.pub, "INSERT INTO items VALUES (1, 'a')")
    if fault == "wrong password":
        password = distinctive_password()
        uri = re.sub(r":[^:@/]+@127", f":{quote(password, safe='')}@127", good)
    elif fault == "unreachable":
        uri = good.replace(f":{mariadb.server.port}/", f":{unused_port()}/")
    else:
        uri = good.replace(f"/{db}", "/no_such_database")
    secrets_ = (password, quote(password, safe=""), password[3:19])  # as given, encoded, its random core
    topo = items_topology(env, uri)
    for run in (
        lambda: distribution_agent.run_distribution(topo, "p", "m1"),
        lambda: validation.validate(topo, "p", ["m1"]),
    ):
        with pytest.raises(ConnectionFailed) as err:
            run()
        message = str(err.value)
        assert "MariaDB subscriber 'm1'" in message and "Check that the MariaDB server" in message, message
        assert "\n" not in message and not any(s in message for s in secrets_), message
    path = topology_file(env, tmp_path, ["public.items"], snapshot_folder=str(tmp_path / "s"), subscribers={"m1": uri})
    capsys.readouterr()
    assert cli.main(["distribution", "-t", path, "--subscriber", "m1"]) == ConnectionFailed.exit_code
    assert cli.main(["validate", "-t", path]) == ConnectionFailed.exit_code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("airflow-repl: error: ") and "'m1'" in line for line in lines), err
    recorded = env.rows(env.dist, "SELECT message FROM airflow_repl.agent_history WHERE message IS NOT NULL")
    recorded += env.rows(env.dist, "SELECT message FROM airflow_repl.errors")
    assert any("MariaDB subscriber 'm1'" in m for (m,) in recorded), recorded
    shown = out + err + caplog.text + "".join(m for (m,) in recorded)
    assert not any(s in shown for s in secrets_)


def test_an_unmappable_type_is_refused_naming_column_and_type(env, spark, mariadb):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, price money)")
    topo, db = mariadb_topology(env, mariadb, ["public.items"])
    with pytest.raises(TopologyError) as err:
        snapshot_agent.run_snapshot(topo, "p", spark)
    assert "column 'price'" in str(err.value) and "money" in str(err.value) and "\n" not in str(err.value)
    assert publications(env) == 0 and mariadb.rows(db, "SHOW TABLES") == []


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ("ALTER TABLE items DROP PRIMARY KEY", "has no primary key"),
        ("ALTER TABLE items ENGINE=MyISAM", "MyISAM storage engine, which has no transactions"),
        ("ALTER TABLE items MODIFY k VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL", "utf8mb4_general_ci"),
    ],
)
def test_a_subscriber_table_it_cannot_apply_to_exactly_once_is_refused(env, spark, mariadb, change, refusal):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, k varchar(20) NOT NULL UNIQUE)")
    env.run(env.pub, "INSERT INTO items VALUES (1, 'a')")
    topo, db = mariadb_topology(env, mariadb, ["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    mariadb.run(db, change)
    env.run(env.pub, "INSERT INTO items VALUES (2, 'b')")
    log_reader_agent.run_log_reader(topo, "p")
    [(before,)] = mariadb.rows(db, "SELECT xact_seqno FROM airflow_repl_subscription_state")
    with pytest.raises(ReplError) as err:
        distribution_agent.run_distribution(topo, "p", "m1")
    assert refusal in str(err.value) and "table 'items'" in str(err.value) and "\n" not in str(err.value)
    assert mariadb.rows(db, "SELECT id FROM items") == [(1,)]
    assert mariadb.rows(db, "SELECT xact_seqno FROM airflow_repl_subscription_state") == [(before,)]


# ---------------------------------------------------------------------- fidelity: the edge data
LONG_COLUMN = "c" + "\u00e9" * 31  # 63 bytes in UTF-8, 32 characters
ODD_COLUMN = 'Quoted "Col"\nline `x` -- /* go 100%s %% %(v)s'
EDGE_DDL = f"""
CREATE TYPE mood AS ENUM ('sad', 'ok', 'h\u00e4ppy ''q''');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE edge (
    id int PRIMARY KEY, n numeric(30,10), ts timestamp, tstz timestamptz, d date, t time, iv interval,
    arr int[], tarr text[], j json, jb jsonb, u uuid, b bytea, m mood, p posint, r int4range, txt text,
    f8 float8, bo boolean, {'"' + LONG_COLUMN + '"'} text, "{ODD_COLUMN.replace('"', '""')}" text
);
"""
EDGE_ROW = (
    "1, 12345678901234567890.0123456789, '2026-02-03 04:05:06.789012', '2026-02-03 04:05:06.5+03', '0001-01-01', "
    "'23:59:59.999999', '1 year 2 mons 3 days 04:05:06.5', '{1,NULL,3}', ARRAY['a b', 'c\"d', 'e\\\\f'], "
    '\'{"b": 1,  "a": [1, 2.50]}\', \'{"b": 1,  "a": [1, 2.50]}\', \'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\', '
    "'\\x00ff0a27', 'h\u00e4ppy ''q''', 7, '[1,5)', 'emoji \U0001f600 quote '' backslash \\ line\nbreak', "
    "1.5e-300, true, 'long', 'odd'"
)


def test_the_edge_data_reaches_a_mariadb_subscriber_by_the_type_map(env, spark, mariadb):
    env.run(env.pub, EDGE_DDL)
    env.run(env.pub, f"INSERT INTO edge VALUES ({EDGE_ROW})")
    env.run(env.pub, "INSERT INTO edge (id) VALUES (2)")  # every other column NULL
    topo, db = mariadb_topology(env, mariadb, ["public.edge"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    # the same values again by the Distribution Agent: row 1 deleted, inserted as 3; row 2 filled
    env.run(
        env.pub,
        "INSERT INTO edge SELECT 3, n, ts, tstz, d, t, iv, arr, tarr, j, jb, u, b, m, p, r, txt, f8, bo, "
        f'"{LONG_COLUMN}", "{ODD_COLUMN.replace(chr(34), chr(34) * 2)}" FROM edge WHERE id = 1',
    )
    env.run(env.pub, "DELETE FROM edge WHERE id = 1")
    env.run(env.pub, "INSERT INTO edge (id) VALUES (1)")
    deliver(topo)
    columns = [r[0] for r in mariadb.rows(db, "SHOW COLUMNS FROM edge")]
    assert LONG_COLUMN in columns and ODD_COLUMN in columns
    rows = {r[0]: r[1:] for r in mariadb.rows(db, "SELECT * FROM edge")}
    assert sorted(rows) == [1, 2, 3]
    assert rows[1] == rows[2] == (None,) * (len(columns) - 1)
    values = dict(zip(columns[1:], rows[3], strict=True))
    assert str(values["n"]) == "12345678901234567890.0123456789"
    assert values["ts"] == datetime(2026, 2, 3, 4, 5, 6, 789012)
    assert values["tstz"] == datetime(2026, 2, 3, 1, 5, 6, 500000)  # in UTC
    assert values["d"] == date(1, 1, 1)
    assert values["t"] == timedelta(hours=23, minutes=59, seconds=59, microseconds=999999)
    # text forms: exactly the publisher's
    [published] = env.rows(env.pub, "SELECT iv::text, arr::text, tarr::text, r::text FROM edge WHERE id = 3")
    assert (values["iv"], values["arr"], values["tarr"], values["r"]) == published
    assert values["iv"] == "1 year 2 mons 3 days 04:05:06.5" and values["arr"] == "{1,NULL,3}"
    assert values["j"] == '{"b": 1,  "a": [1, 2.50]}'  # json keeps its text
    assert values["jb"] == '{"a": [1, 2.50], "b": 1}'  # jsonb's normal form
    assert values["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert values["b"] == b"\x00\xff\n'"
    assert values["m"] == "h\u00e4ppy 'q'" and values["p"] == 7 and values["r"] == "[1,5)"
    assert values["txt"] == "emoji \U0001f600 quote ' backslash \\ line\nbreak"
    assert values["f8"] == 1.5e-300 and values["bo"] == 1
    assert values[LONG_COLUMN] == "long" and values[ODD_COLUMN] == "odd"


def test_a_second_distribution_agent_is_refused_while_one_delivers(env, spark, mariadb):
    topo, db = backlog(env, mariadb, spark, 10)
    holder = mariadb.connect(db)
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT GET_LOCK(CONCAT('airflow_repl:', DATABASE(), ':', 'p'), 0)")
        with pytest.raises(AgentBusy, match="another Distribution Agent is delivering"):
            distribution_agent.run_distribution(topo, "p", "m1")
        assert mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(0,)]
    finally:
        holder.close()
    distribution_agent.run_distribution(topo, "p", "m1")
    assert_applied_once(mariadb, db, 10)


# ---------------------------------------------------------------------- validate
def test_validate_finds_a_changed_a_missing_and_an_extra_row_by_value(env, spark, mariadb):
    env.run(env.pub, EDGE_DDL)
    env.run(env.pub, f"INSERT INTO edge VALUES ({EDGE_ROW})")
    env.run(env.pub, "INSERT INTO edge (id) SELECT g FROM generate_series(2, 20) g")
    topo, db = mariadb_topology(env, mariadb, ["public.edge"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    [line] = validation.compare(topo, "p", "m1")
    assert line["match"] and line["publisher_rows"] == line["subscriber_rows"] == 20, line  # every edge value equal
    mariadb.run(db, "UPDATE edge SET tstz = '2026-02-03 01:05:06.4' WHERE id = 1")
    mariadb.run(db, "DELETE FROM edge WHERE id = 5")
    mariadb.run(db, "INSERT INTO edge (id) VALUES (99)")
    [line] = validation.compare(topo, "p", "m1")
    assert (line["match"], line["missing"], line["extra"], line["different"]) == (False, 1, 1, 1)
    assert sorted((d["key"], d["difference"]) for d in line["differences"]) == [
        ("1", validation.DIFFERENT),
        ("5", validation.MISSING),
        ("99", validation.EXTRA),
    ]


# ---------------------------------------------------------------------- an Airflow mysql connection
def test_a_subscriber_named_by_an_airflow_mysql_connection_with_extras(env, spark, mariadb, monkeypatch):
    from airflow_repl.hooks import connections as airflow_connections

    db = mariadb.new_database()
    server = mariadb.server
    monkeypatch.setenv(
        "AIRFLOW_CONN_REPL_T_MARIADB",
        json.dumps(
            {
                "conn_type": "mysql",
                "host": "127.0.0.1",
                "port": server.port,
                "login": "root",
                "password": server.password,
                "schema": db,
                "extra": {"connect_timeout": 7, "cursor": "sscursor", "local_infile": True},
            }
        ),
    )
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items VALUES (1, 'a')")
    servers = env.servers(subscribers=[])
    servers["subscribers"] = {"m1": "repl_t_mariadb"}
    topo = airflow_connections.resolve_topology(
        topology_mod.from_dict(
            {
                **servers,
                "publications": [{"name": "p", "articles": ["public.items"]}],
                "subscriptions": [{"publication": "p", "subscriber": "m1"}],
            }
        )
    )
    args = mariadb_connections.connect_args(topo.subscriber_conninfo("m1"))
    assert (args["connect_timeout"], args["local_infile"], "cursor" in args) == (7, True, False)
    assert topo.to_dict()["subscribers"]["m1"] == "repl_t_mariadb"  # no password in the displayed topology
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "INSERT INTO items VALUES (2, 'b')")
    deliver(topo)
    assert mariadb.rows(db, "SELECT id, v FROM items ORDER BY id") == [(1, "a"), (2, "b")]


def test_a_backlog_across_wal_0_10000000_is_delivered_in_order(wal_env, spark, mariadb):
    env = wal_env("0/10000000")
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    topo, db = mariadb_topology(env, mariadb, ["public.items"], commit_batch_size=3)
    snapshot_agent.run_snapshot(topo, "p", spark)
    for i in range(1, 6):  # before the boundary: LSNs of 7 hex digits
        env.run(env.pub, "INSERT INTO items VALUES (%s, 'before')", (i,))
    env.cross_boundary()
    for i in range(6, 11):  # after it: 8 digits, greater as numbers, smaller as text
        env.run(env.pub, "INSERT INTO items VALUES (%s, 'after')", (i,))
    env.run(env.pub, "UPDATE items SET v = 'last' WHERE id = 1")
    done = deliver(topo)
    assert done["transactions"] == 11
    assert mariadb.rows(db, "SELECT COUNT(*), SUM(v = 'after'), MAX(v = 'last') FROM items") == [(10, 5, 1)]
    [(text, position)] = mariadb.rows(db, "SELECT xact_seqno, position FROM airflow_repl_subscription_state")
    assert lsn_to_int(text) == position > lsn_to_int("0/10000000") and text == done["last_xact_seqno"]
    assert deliver(topo)["transactions"] == 0


def test_reinitialize_replaces_a_drifted_subscriber_and_a_file_loads_once(env, spark, mariadb):
    import contextlib

    import pyarrow as pa

    from airflow_repl.engine.agents.mariadb_snapshot import TableLoad
    from airflow_repl.engine.state import dist_publications

    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 30) g")
    topo, db = mariadb_topology(env, mariadb, ["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    mariadb.run(db, "DELETE FROM items WHERE id <= 10")
    mariadb.run(db, "INSERT INTO items VALUES (99, 'extra')")
    assert not validation.compare(topo, "p", "m1")[0]["match"]
    again = snapshot_agent.run_snapshot(topo, "p", spark, reinitialize=True)
    assert again["initialized"] == ["m1"]
    assert validation.compare(topo, "p", "m1")[0]["match"]
    [(snapshot_id, files, rows)] = mariadb.rows(
        db, "SELECT snapshot_id, COUNT(*), SUM(`rows`) FROM airflow_repl_snapshot_files GROUP BY snapshot_id"
    )
    assert snapshot_id == again["snapshot_id"] and rows == 30 and files >= 1
    # a Spark task run again finds its file in the ledger: nothing is loaded twice
    [(path,)] = mariadb.rows(db, "SELECT path FROM airflow_repl_snapshot_files LIMIT 1")
    with psycopg.connect(env.dist) as dist:
        [article] = dist_publications.load_articles(dist, "p")
    with contextlib.ExitStack() as stack:
        load = TableLoad(stack, "m1", topo.subscriber_conninfo("m1"), article, snapshot_id, path)
        assert not load.claimed
    with contextlib.ExitStack() as stack:
        load = TableLoad(
            stack, "m1", topo.subscriber_conninfo("m1"), article, snapshot_id, "data/new/part-00009.parquet"
        )
        assert load.claimed
        load.write_batch(pa.record_batch([pa.array([500], pa.int32()), pa.array(["new"])], names=["id", "v"]))
        load.end(1)  # not committed: the stack rolls it back
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items WHERE id = 500") == [(0,)]


# ---------------------------------------------------------------------- the command line
def test_cli_snapshots_delivers_to_and_validates_a_mariadb_subscriber(env, spark, mariadb, tmp_path, capsys):
    from airflow_repl import cli

    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 100) g")
    db = mariadb.new_database()
    snaps = str(tmp_path / "snaps")
    topo = topology_file(env, tmp_path, ["public.orders"], snapshot_folder=snaps, subscribers={"m1": mariadb.uri(db)})
    assert cli.main(["snapshot", "-t", topo]) == 0
    assert json.loads(capsys.readouterr().out)["initialized"] == ["m1"]
    env.run(env.pub, "UPDATE orders SET v = 'w' WHERE id <= 10")
    assert cli.main(["logreader", "-t", topo]) == 0
    assert cli.main(["distribution", "-t", topo, "--subscriber", "m1"]) == 0
    capsys.readouterr()
    assert cli.main(["validate", "-t", topo, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["subscribers"]["m1"][0]["match"] is True
    mariadb.run(db, "DELETE FROM orders WHERE id = 1")
    assert cli.main(["validate", "-t", topo]) == 6
    out, err = capsys.readouterr()
    assert "subscriber m1:" in out and "missing" in out
    assert mariadb.server.password not in out + err
    assert cli.main(["status", "-t", topo]) == 0
    out, err = capsys.readouterr()
    assert "m1" in out and mariadb.server.password not in out + err


def test_auto_applies_a_table_with_triggers_statement_by_statement_and_says_why(env, spark, mariadb):
    """Under the default ``apply_mode: auto`` a table with a trigger at MariaDB is applied
    statement by statement (the trigger sees every command), saying why."""
    topo, db = backlog(env, mariadb, spark, 3)
    done = distribution_agent.run_distribution(topo, "p", "m1")  # apply_mode auto (the default)
    assert done["transactions"] == 3 and "net_batches" not in done
    assert done["apply"] == [
        {
            "article": "items",
            "apply": "per_command",
            "why": "trigger(s) firing for replicated changes at the subscriber: applied_D, applied_I, applied_U",
        }
    ]
    assert_applied_once(mariadb, db, 3)


def test_a_continuous_distribution_to_mariadb_is_woken_by_the_stored_batch_not_its_poll(env, spark, mariadb):
    """Idle with a poll interval longer than its run, it delivers what a Log Reader run stores
    within seconds (before, it slept to the end of its run and delivered nothing)."""
    topo, db = backlog(env, mariadb, spark, 0)
    runs = 40.0
    agent = AgentThread(
        distribution_agent.run_distribution, topo, "p", "m1", continuous=True, poll_interval=600, max_run_seconds=runs
    )
    agent.start()
    history = "SELECT status FROM airflow_repl.agent_history WHERE agent = 'distribution' ORDER BY run_id DESC LIMIT 1"
    assert wait_for(lambda: env.rows(env.dist, history) == [("running",)] or not agent.is_alive(), 60) is not None
    for n in (1, 2):
        env.run(env.pub, "INSERT INTO items (id, v) VALUES (%s, 'woken')", (n,))
        assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 1
        took = wait_for(lambda n=n: mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(n,)], 15)
        assert took is not None, f"not delivered within 15 s of being stored ({agent.error!r})"
    agent.join(runs + 30)
    assert agent.error is None and agent.summary["transactions"] == 2
    assert agent.summary["continuous"]["ended_by"] == "max_run_seconds"


@pytest.mark.parametrize("apply_mode", ["auto", "per_command"])
def test_a_finished_run_leaves_no_session_at_mariadb_so_the_next_run_takes_the_lock(env, spark, mariadb, apply_mode):
    """A run that succeeded closed its MariaDB connections (the subscription's lock is their
    session's): before, they stayed open until Python's cyclic garbage collector freed the run,
    and the next run met 'another Distribution Agent is delivering'."""
    import gc

    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    topo, db = mariadb_topology(env, mariadb, ["public.items"], apply_mode=apply_mode)
    snapshot_agent.run_snapshot(topo, "p", spark)
    sessions = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> CONNECTION_ID()"
    gc.disable()  # the collector cannot close them behind the test's back
    try:
        for n in (1, 2, 3, 4):
            if n == 3:  # a row not found, skipped: the batch falls back from net change and is replayed
                mariadb.run(db, "DELETE FROM items WHERE id = 1")
                env.run(env.pub, "UPDATE items SET v = 'gone' WHERE id = 1")
            else:
                env.run(env.pub, "INSERT INTO items VALUES (%s, 'v')", (n,))
            assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 1
            done = distribution_agent.run_distribution(topo, "p", "m1", skip_errors=["20598"])
            assert done["transactions"] == 1 and done["skipped"] == (n == 3), done
            assert mariadb.rows(db, sessions, (db,)) == [(0,)], f"after run {n}"
    finally:
        gc.enable()
    assert mariadb.rows(db, "SELECT id FROM items ORDER BY id") == [(2,), (4,)]
