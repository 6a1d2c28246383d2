"""Schema changes (``airflow-repl schema-change``) replicated to a MariaDB subscriber in commit
order with MariaDB's DDL, with row changes just before and after them (in separate
transactions and in the change's own), compared row by row; exactly once although MariaDB's
DDL commits on its own: a Distribution Agent killed right after the ALTER TABLE, before its
progress is recorded, and run again applies everything once."""

from __future__ import annotations

import psycopg
import pytest
from harness import (
    SCHEMA_CHANGES,
    assert_in_sync,
    count_applied,
    deliver,
    mariadb_topology,
    run_agent_process,
    schema_change_dml,
    schema_change_dml_after,
    spec_file,
)

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.provisioning.schema_change import schema_change

PROGRESS = "airflow_repl_schema_progress"


def _snapshotted(env, mariadb, spark, table: str, statements: str):
    """``public.<table>`` made by ``statements`` at the publisher and snapshotted to a MariaDB subscriber."""
    env.run(env.pub, statements)
    topo, db = mariadb_topology(env, mariadb, [f"public.{table}"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo, db


def _items(env, mariadb, spark):
    return _snapshotted(
        env,
        mariadb,
        spark,
        "items",
        "CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, note varchar(20));"
        "INSERT INTO items SELECT g, g * 10, 'n' || g FROM generate_series(1, 20) g",
    )


def _column(mariadb, db, name):
    rows = mariadb.rows(
        db,
        "SELECT DATA_TYPE, IS_NULLABLE, COLUMN_DEFAULT FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'items' AND COLUMN_NAME = %s",
        (db, name),
    )
    return rows[0] if rows else None


#: The MariaDB type each change leaves (DATA_TYPE), as the type map has it.
MARIADB_TYPES = {
    "add_nullable": "longtext",
    "add_default_not_null": "int",
    "rename": "varchar",
    "widen_int": "bigint",
    "widen_varchar": "longtext",
}


@pytest.mark.parametrize("change", list(SCHEMA_CHANGES))
def test_each_change_reaches_a_mariadb_subscriber_in_commit_order(env, spark, mariadb, change):
    topo, db = _items(env, mariadb, spark)
    template, expected = SCHEMA_CHANGES[change]
    with psycopg.connect(env.pub) as conn:
        schema_change_dml(conn, "items", 100)  # a transaction just before the change
        conn.commit()
        schema_change_dml(conn, "items", 200)  # row changes before and after it in its own transaction
        schema_change(topo, "p", template.format(t="items"), connection=conn)
        schema_change_dml_after(conn, "items", 300, change)
        conn.commit()
        schema_change_dml_after(conn, "items", 400, change)  # and just after it
        conn.commit()
    done = deliver(topo)
    assert done["transactions"] == 3 and done["schema_changes"] == 1, done
    report = assert_in_sync(topo, "m1")  # row by row, by canonical value
    assert report[0]["subscriber_rows"] == env.rows(env.pub, "SELECT count(*) FROM items")[0][0]
    if expected is not None:
        found = _column(mariadb, db, expected[0])
        assert found is not None and found[0] == MARIADB_TYPES[change], found
        if change == "add_default_not_null":
            assert found[1:] == ("NO", None)  # the existing rows' value is no default there
    if change in ("drop", "rename"):
        assert _column(mariadb, db, "note") is None
    assert mariadb.rows(db, f"SELECT COUNT(*) FROM {PROGRESS}") == [(0,)]
    # the next delivery is a plain one, with the new columns
    with psycopg.connect(env.pub) as conn:
        schema_change_dml_after(conn, "items", 500, change)
        conn.commit()
    assert deliver(topo)["transactions"] == 1
    assert_in_sync(topo, "m1")


def test_a_type_the_map_refuses_stops_before_anything_changes(env, spark, mariadb):
    topo, db = _items(env, mariadb, spark)
    with psycopg.connect(env.pub) as conn:
        conn.execute("INSERT INTO items VALUES (100, 1, 'before')")
        schema_change(topo, "p", "ALTER TABLE items ADD COLUMN spot point", connection=conn)
        conn.commit()
    with pytest.raises(ReplError) as refused:
        deliver(topo)
    message = str(refused.value)
    assert "\n" not in message and "'spot'" in message and "point" in message, message
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items WHERE id = 100") == [(0,)]
    assert _column(mariadb, db, "spot") is None
    assert mariadb.rows(db, f"SELECT COUNT(*) FROM {PROGRESS}") == [(0,)]


def _kill_after_the_ddl(mariadb, db, topo, tmp_path, column):
    """Read the stored transaction and run the Distribution Agent as a process, killed once its
    ALTER TABLE committed (MariaDB commits DDL on its own) and before its progress moved past
    it: the agent records that progress with an UPDATE, which a trigger holds."""
    log_reader_agent.run_log_reader(topo, "p")
    mariadb.run(db, f"CREATE TRIGGER hold BEFORE UPDATE ON {PROGRESS} FOR EACH ROW BEGIN DO SLEEP(4); END")
    outcome = run_agent_process(
        "distribution", spec_file(topo, tmp_path), {"subscriber": "m1"}, kill_when=lambda: _column(mariadb, db, column)
    )
    assert outcome.killed, outcome
    mariadb.run(db, "DROP TRIGGER hold")
    assert _column(mariadb, db, column) is not None


def test_an_agent_killed_right_after_the_ddl_applies_it_once_when_run_again(env, spark, mariadb, tmp_path):
    topo, db = _items(env, mariadb, spark)
    count_applied(mariadb, db)
    with psycopg.connect(env.pub) as conn:
        conn.execute("INSERT INTO items VALUES (700, 1, 'before')")
        conn.execute("UPDATE items SET qty = 0 WHERE id = 1")
        schema_change(topo, "p", "ALTER TABLE items ADD COLUMN c2 int DEFAULT 3", connection=conn)
        conn.execute("INSERT INTO items VALUES (777, 1, 'after', 4)")
        conn.execute("DELETE FROM items WHERE id = 2")
        conn.commit()
    _kill_after_the_ddl(mariadb, db, topo, tmp_path, "c2")
    # the ALTER TABLE committed on its own; the rows before it with the progress just before it
    assert len(mariadb.rows(db, f"SELECT xact_seqno, command_id FROM {PROGRESS}")) == 1
    assert mariadb.rows(db, "SELECT op, COUNT(*) FROM applied GROUP BY op ORDER BY op") == [("I", 1), ("U", 1)]
    again = distribution_agent.run_distribution(topo, "p", "m1")
    # the ADD COLUMN found applied (run twice it fails: duplicate column), the two rows after it applied
    assert (again["transactions"], again["commands"]) == (1, 2), again
    assert mariadb.rows(db, "SELECT op, COUNT(*) FROM applied GROUP BY op ORDER BY op") == [
        ("D", 1),
        ("I", 2),
        ("U", 1),
    ]
    assert mariadb.rows(db, "SELECT id, c2 FROM items WHERE id >= 700 ORDER BY id") == [(700, 3), (777, 4)]
    assert mariadb.rows(db, f"SELECT COUNT(*) FROM {PROGRESS}") == [(0,)]
    assert_in_sync(topo, "m1")


def test_an_agent_killed_after_renaming_a_key_column_resumes_when_run_again(env, spark, mariadb, tmp_path):
    """The rerun's table check expects the key the partly applied transaction left (the renamed
    column), not the one before it: it refused before."""
    topo, db = _items(env, mariadb, spark)
    with psycopg.connect(env.pub) as conn:
        conn.execute("UPDATE items SET qty = 0 WHERE id = 1")
        schema_change(topo, "p", "ALTER TABLE items RENAME COLUMN id TO ident", connection=conn)
        conn.execute("INSERT INTO items VALUES (777, 1, 'after')")
        conn.execute("DELETE FROM items WHERE ident = 2")
        conn.commit()
    _kill_after_the_ddl(mariadb, db, topo, tmp_path, "ident")
    assert _column(mariadb, db, "id") is None
    again = distribution_agent.run_distribution(topo, "p", "m1")
    assert (again["transactions"], again["commands"]) == (1, 2), again
    assert mariadb.rows(db, "SELECT ident, qty FROM items WHERE ident IN (1, 2, 777) ORDER BY ident") == [
        (1, 0),
        (777, 1),
    ]
    assert mariadb.rows(db, f"SELECT COUNT(*) FROM {PROGRESS}") == [(0,)]
    assert_in_sync(topo, "m1")


def test_generated_procedures_follow_a_schema_change(env, spark, mariadb):
    """An article that calls its generated procedures at the MariaDB subscriber: an added column
    arrives in the procedures recreated with the change, so the rows written after it (an insert
    and an update of the new column) arrive whole."""
    env.run(
        env.pub,
        "CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL);"
        "INSERT INTO items SELECT g, g * 10 FROM generate_series(1, 5) g",
    )
    article = {
        "table": "public.items",
        "ins_cmd": "CALL sp_MSins_publicitems",
        "upd_cmd": "MCALL sp_MSupd_publicitems",
        "del_cmd": "CALL sp_MSdel_publicitems",
    }
    topo, db = mariadb_topology(env, mariadb, [article])
    snapshot_agent.run_snapshot(topo, "p", spark)
    with psycopg.connect(env.pub) as conn:
        schema_change(topo, "p", "ALTER TABLE items ADD COLUMN note text", connection=conn)
        conn.commit()
        conn.execute("INSERT INTO items VALUES (6, 60, 'six')")
        conn.execute("UPDATE items SET note = 'one', qty = 11 WHERE id = 1")
        conn.execute("DELETE FROM items WHERE id = 2")
        conn.commit()
    done = deliver(topo)
    assert done["schema_changes"] == 1, done
    assert mariadb.rows(db, "SELECT id, qty, note FROM items ORDER BY id") == [
        (1, 11, "one"),
        (3, 30, None),
        (4, 40, None),
        (5, 50, None),
        (6, 60, "six"),
    ]
    [(body,)] = mariadb.rows(
        db,
        "SELECT ROUTINE_DEFINITION FROM information_schema.ROUTINES "
        "WHERE ROUTINE_SCHEMA = %s AND ROUTINE_NAME = 'sp_MSins_publicitems'",
        (db,),
    )
    assert "note" in body


def test_a_key_column_widened_to_text_takes_what_the_keys_int_leaves(env, spark, mariadb):
    topo, db = _snapshotted(
        env,
        mariadb,
        spark,
        "keyed",
        "CREATE TABLE keyed (id int, k varchar(10), v int, PRIMARY KEY (id, k));"
        "INSERT INTO keyed VALUES (1, 'a', 1), (1, 'A', 2)",
    )
    with psycopg.connect(env.pub) as conn:
        schema_change(topo, "p", "ALTER TABLE keyed ALTER COLUMN k TYPE text", connection=conn)
        conn.execute("INSERT INTO keyed VALUES (2, %s, 3)", ("\U0001f600" * 700,))
        conn.commit()
    done = deliver(topo)  # VARCHAR(768) beside the int was 4 bytes over InnoDB's limit: error 1071
    assert done["schema_changes"] == 1, done
    assert mariadb.rows(
        db,
        "SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'keyed' "
        "AND COLUMN_NAME = 'k'",
        (db,),
    ) == [("varchar(767)",)]
    assert_in_sync(topo, "m1")
