"""Procedures in a MariaDB subscriber's apply path, end to end with real servers: the generated
procedures an article names (created by the Snapshot Agent) and custom procedures the user
created, each call syntax through the Log Reader and the Distribution Agent: NULLs, a key change
(a DELETE/INSERT pair), 4-byte UTF-8, a hostile column name; row not found (20598) stopping
delivery or skipped; a missing procedure refused with one line."""

from __future__ import annotations

import pytest
from harness import deliver, mariadb_topology
from psycopg import sql

from airflow_repl.engine.agents import distribution_agent, snapshot_agent
from airflow_repl.engine.errors import DeliveryError, ReplError

#: A column name with a backtick, a line break, a comment and a quote.
HOSTILE = "v`x\n-- it's"
#: (update syntax, delete syntax) of each call syntax's test.
SYNTAXES = [("CALL", "CALL"), ("SCALL", "CALL"), ("MCALL", "CALL"), ("XCALL", "XCALL")]
EMOJI = "caf\u00e9 \U0001f600"


def _table(env) -> None:
    env.run(
        env.pub,
        sql.SQL("CREATE TABLE items (id int PRIMARY KEY, {} text, n int)").format(sql.Identifier(HOSTILE)),
    )
    env.run(env.pub, "INSERT INTO items VALUES (1, 'one', 1), (2, NULL, 2), (3, 'three', NULL), (4, 'four', 4)")


def _changes(env) -> None:
    ident = sql.Identifier(HOSTILE)
    env.run(env.pub, sql.SQL("INSERT INTO items VALUES (5, {}, NULL), (6, NULL, NULL)").format(sql.Literal(EMOJI)))
    env.run(env.pub, sql.SQL("UPDATE items SET {} = {} WHERE id = 2").format(ident, sql.Literal(EMOJI)))
    env.run(env.pub, sql.SQL("UPDATE items SET {} = NULL, n = 30 WHERE id = 3").format(ident))
    env.run(env.pub, "UPDATE items SET n = NULL WHERE id = 4")
    env.run(env.pub, "UPDATE items SET id = 100 WHERE id = 1")  # a key change: a DELETE/INSERT pair
    env.run(env.pub, "DELETE FROM items WHERE id = 6")


def _publisher_rows(env) -> list[tuple]:
    return sorted(env.rows(env.pub, sql.SQL("SELECT id, {}, n FROM items").format(sql.Identifier(HOSTILE))))


def _subscriber_rows(mariadb, db) -> list[tuple]:
    return sorted(mariadb.rows(db, "SELECT id, `v``x\n-- it's`, n FROM items"))


def _calls(mariadb) -> int:
    [(_, n)] = mariadb.rows(None, "SHOW GLOBAL STATUS LIKE 'Com_call_procedure'")
    return int(n)


@pytest.mark.parametrize(("upd", "dele"), SYNTAXES)
def test_generated_procedures_chosen_by_name_apply_every_change(env, spark, mariadb, upd, dele):
    _table(env)
    article = {
        "table": "public.items",
        "ins_cmd": "CALL sp_MSins_publicitems",
        "upd_cmd": f"{upd} sp_MSupd_publicitems",
        "del_cmd": f"{dele} sp_MSdel_publicitems",
    }
    # command by command: under apply_mode auto a batch of generated procedures goes by net change
    topo, db = mariadb_topology(env, mariadb, [article], apply_mode="per_command")
    snapshot_agent.run_snapshot(topo, "p", spark)
    routines = mariadb.rows(
        db, "SELECT ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = %s ORDER BY 1", (db,)
    )
    assert routines == [("sp_MSdel_publicitems",), ("sp_MSins_publicitems",), ("sp_MSupd_publicitems",)]
    _changes(env)
    before = _calls(mariadb)
    done = deliver(topo)
    assert done["transactions"] == 6
    # 2 inserts, 3 updates, the key change's delete and insert, 1 delete: each one a CALL
    assert _calls(mariadb) - before == 8
    assert _subscriber_rows(mariadb, db) == _publisher_rows(env)
    assert (5, EMOJI, None) in _subscriber_rows(mariadb, db)


def test_the_default_stays_sql_statements(env, spark, mariadb):
    _table(env)
    topo, db = mariadb_topology(env, mariadb, ["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    assert mariadb.rows(db, "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = %s", (db,)) == [
        (0,)
    ]
    _changes(env)
    before = _calls(mariadb)
    deliver(topo)
    assert _calls(mariadb) == before
    assert _subscriber_rows(mariadb, db) == _publisher_rows(env)


#: Custom procedures: each records the arguments it got (NULL as ``-``, the bitmap in hex) in
#: ``audit`` and applies the change, raising 20598 when its key matched no row.
def _custom_procedures(mariadb, db, upd: str, dele: str) -> None:
    col = "`v``x\n-- it's`"
    nf = "SIGNAL SQLSTATE 'RP598' SET MYSQL_ERRNO = 20598, MESSAGE_TEXT = 'row not found [20598]'"
    txt = "TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"

    def show(*args: str) -> str:
        return "CONCAT_WS('|', " + ", ".join(f"IFNULL({a}, '-')" for a in args) + ")"

    mariadb.run(db, "CREATE TABLE audit (seq int AUTO_INCREMENT PRIMARY KEY, op char(3), args text) ENGINE=InnoDB")
    mariadb.run(
        db,
        f"CREATE PROCEDURE my_ins(IN c1 INT, IN c2 {txt}, IN c3 INT) MODIFIES SQL DATA BEGIN "
        f"INSERT INTO audit (op, args) VALUES ('ins', {show('c1', 'c2', 'c3')}); "
        f"INSERT INTO items (id, {col}, n) VALUES (c1, c2, c3); END",
    )
    if upd == "CALL":
        params, args, body = (
            f"IN c1 INT, IN c2 {txt}, IN c3 INT, IN pkc1 INT",
            ("c1", "c2", "c3", "pkc1"),
            f"UPDATE items SET id = c1, {col} = c2, n = c3 WHERE items.id = pkc1",
        )
    elif upd in ("SCALL", "MCALL"):
        params, args, body = (
            f"IN c1 INT, IN c2 {txt}, IN c3 INT, IN pkc1 INT, IN bitmap LONGBLOB",
            ("c1", "c2", "c3", "pkc1", "HEX(bitmap)"),
            f"UPDATE items SET {col} = IF(ASCII(bitmap) & 2, c2, {col}), n = IF(ASCII(bitmap) & 4, c3, n) "
            f"WHERE items.id = pkc1",
        )
    else:
        params, args, body = (
            f"IN c1 INT, IN c2 {txt}, IN c3 INT, IN c4 INT, IN c5 {txt}, IN c6 INT",
            ("c1", "c2", "c3", "c4", "c5", "c6"),
            f"UPDATE items SET id = c4, {col} = c5, n = c6 WHERE items.id = c1",
        )
    mariadb.run(
        db,
        f"CREATE PROCEDURE my_upd({params}) MODIFIES SQL DATA BEGIN "
        f"INSERT INTO audit (op, args) VALUES ('upd', {show(*args)}); {body}; "
        f"IF ROW_COUNT() = 0 THEN {nf}; END IF; END",
    )
    dparams, dargs = (
        ("IN pkc1 INT", ("pkc1",)) if dele == "CALL" else (f"IN c1 INT, IN c2 {txt}, IN c3 INT", ("c1", "c2", "c3"))
    )
    mariadb.run(
        db,
        f"CREATE PROCEDURE my_del({dparams}) MODIFIES SQL DATA BEGIN "
        f"INSERT INTO audit (op, args) VALUES ('del', {show(*dargs)}); "
        f"DELETE FROM items WHERE items.id = {dargs[0]}; IF ROW_COUNT() = 0 THEN {nf}; END IF; END",
    )


#: What each custom update procedure receives for ``UPDATE items SET n = 30, <hostile> = NULL WHERE id = 3``
#: (row (3, 'three', NULL) before) and the DELETE of row 6.
EXPECTED_UPDATE = {
    "CALL": "3|-|30|3",
    "SCALL": "-|-|30|3|06",  # changed columns only, bits 2 and 3
    "MCALL": "3|-|30|3|06",  # every new value, the same bits
    "XCALL": "3|three|-|3|-|30",  # before image, then after image
}
EXPECTED_DELETE = {"CALL": "6", "XCALL": "6|-|-"}


@pytest.mark.parametrize(("upd", "dele"), SYNTAXES)
def test_custom_procedures_get_the_call_syntaxs_parameters_and_bitmask(env, spark, mariadb, upd, dele):
    _table(env)
    article = {
        "table": "public.items",
        "ins_cmd": "CALL my_ins",
        "upd_cmd": f"{upd} my_upd",
        "del_cmd": f"{dele} my_del",
    }
    db = mariadb.new_database()
    topo, _ = mariadb_topology(env, mariadb, [article], db=db)
    with pytest.raises(ReplError) as err:  # checked before anything changes
        snapshot_agent.run_snapshot(topo, "p", spark)
    assert "my_ins" in str(err.value) and "does not exist" in str(err.value) and "\n" not in str(err.value)
    assert mariadb.rows(db, "SHOW TABLES") == []
    _custom_procedures(mariadb, db, upd, dele)
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, sql.SQL("UPDATE items SET n = 30, {} = NULL WHERE id = 3").format(sql.Identifier(HOSTILE)))
    env.run(env.pub, sql.SQL("INSERT INTO items VALUES (6, {}, NULL)").format(sql.Literal(EMOJI)))
    env.run(env.pub, "DELETE FROM items WHERE id = 6")
    env.run(env.pub, "UPDATE items SET id = 100 WHERE id = 1")  # DELETE/INSERT pair
    deliver(topo)
    audit = mariadb.rows(db, "SELECT op, args FROM audit ORDER BY seq")
    assert audit == [
        ("upd", EXPECTED_UPDATE[upd]),
        ("ins", f"6|{EMOJI}|-"),
        ("del", EXPECTED_DELETE[dele].replace("6|-|-", f"6|{EMOJI}|-")),
        ("del", "1" if dele == "CALL" else "1|one|1"),
        ("ins", "100|one|1"),
    ]
    assert _subscriber_rows(mariadb, db) == _publisher_rows(env)


@pytest.mark.parametrize("kind", ["generated", "custom"])
def test_row_not_found_from_a_procedure_stops_delivery_or_is_skipped(env, spark, mariadb, kind):
    _table(env)
    names = ("sp_MSupd_publicitems", "sp_MSdel_publicitems") if kind == "generated" else ("my_upd", "my_del")
    article = {
        "table": "public.items",
        "upd_cmd": f"SCALL {names[0]}",
        "del_cmd": f"CALL {names[1]}",
        "ins_cmd": "CALL sp_MSins_publicitems" if kind == "generated" else "CALL my_ins",
    }
    db = mariadb.new_database()
    if kind == "custom":
        _custom_procedures(mariadb, db, "SCALL", "CALL")
    topo, _ = mariadb_topology(env, mariadb, [article], db=db)
    snapshot_agent.run_snapshot(topo, "p", spark)
    mariadb.run(db, "DELETE FROM items WHERE id IN (1, 2)")
    env.run(env.pub, "INSERT INTO items VALUES (7, 'seven', 7)")
    env.run(env.pub, "UPDATE items SET n = 10 WHERE id = 1")
    env.run(env.pub, "INSERT INTO items VALUES (8, 'eight', 8)")
    env.run(env.pub, "DELETE FROM items WHERE id = 2")
    env.run(env.pub, "INSERT INTO items VALUES (9, 'nine', 9)")
    with pytest.raises(DeliveryError) as err:
        deliver(topo)
    assert "20598" in str(err.value) and "\n" not in str(err.value)
    assert sorted(mariadb.rows(db, "SELECT id FROM items")) == [(3,), (4,), (7,)]  # what came before it committed
    done = distribution_agent.run_distribution(topo, "p", "m1", skip_errors=["20598"])
    assert done["skipped"] == 2
    assert sorted(mariadb.rows(db, "SELECT id FROM items")) == [(3,), (4,), (7,), (8,), (9,)]


def test_a_dropped_generated_procedure_is_refused_naming_it(env, spark, mariadb):
    _table(env)
    article = {"table": "public.items", "upd_cmd": "MCALL sp_MSupd_publicitems"}
    topo, db = mariadb_topology(env, mariadb, [article])
    snapshot_agent.run_snapshot(topo, "p", spark)
    mariadb.run(db, "DROP PROCEDURE sp_MSupd_publicitems")
    env.run(env.pub, "UPDATE items SET n = 10 WHERE id = 1")
    with pytest.raises(ReplError) as err:
        deliver(topo)
    message = str(err.value)
    assert "sp_MSupd_publicitems" in message and "reinitialize" in message and "\n" not in message
    assert mariadb.rows(db, "SELECT n FROM items WHERE id = 1") == [(1,)]
