"""Schema changes replicated in commit order (``airflow-repl schema-change``), end to end:
publisher -> Log Reader -> Distribution Agent -> real PostgreSQL subscribers, with the data
changes committed just before and just after the change (in separate transactions and in the
same one), under every call syntax, with procedures regenerated in the same subscriber commit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest
from harness import (
    AGENT_RUNNER,
    SCHEMA_CHANGES,
    assert_in_sync,
    cycle,
    schema_change_dml,
    schema_change_dml_after,
)

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import DeliveryError, ReplError, TopologyError
from airflow_repl.engine.model.ddl import SchemaChangeError
from airflow_repl.engine.provisioning import custom_scripting
from airflow_repl.engine.provisioning.procedure_regeneration import regenerate_procedures
from airflow_repl.engine.provisioning.schema_change import schema_change

#: One table per way of propagating: every call syntax of each operation, and SQL statements.
SYNTAX_TABLES = {
    "t_call": {"upd_cmd": "CALL", "del_cmd": "CALL"},
    "t_scall": {"upd_cmd": "SCALL", "del_cmd": "XCALL"},
    "t_mcall": {"upd_cmd": "MCALL"},
    "t_xcall": {"upd_cmd": "XCALL", "del_cmd": "XCALL"},
    "t_sql": {"ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"},
}


def _tables_env(env, spark, tables=SYNTAX_TABLES, subscribers=None):
    for t in tables:
        env.run(
            env.pub,
            f"CREATE TABLE {t} (id int PRIMARY KEY, qty int NOT NULL, note varchar(20));"
            f"INSERT INTO {t} SELECT g, g * 10, 'n' || g FROM generate_series(1, 20) g",
        )
    topo = env.topology([{"table": f"public.{t}", **opts} for t, opts in tables.items()])
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


def _subscriber_column(env, t, name, sub=None):
    rows = env.rows(
        sub or env.sub,
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s "
        "AND NOT attisdropped",
        (t, name),
    )
    return rows[0][0] if rows else None


@pytest.mark.parametrize("change", list(SCHEMA_CHANGES))
def test_each_supported_change_in_commit_order_under_every_call_syntax(env, spark, change):
    topo = _tables_env(env, spark)
    template, expected = SCHEMA_CHANGES[change]
    with psycopg.connect(env.pub) as conn:
        for t in SYNTAX_TABLES:  # a transaction just before the change
            schema_change_dml(conn, t, 100)
        conn.commit()
        for t in SYNTAX_TABLES:  # data changes before and after it in its own transaction
            schema_change_dml(conn, t, 200)
            schema_change(topo, "p", template.format(t=t), connection=conn)
            schema_change_dml_after(conn, t, 300, change)
        conn.commit()
        for t in SYNTAX_TABLES:  # and just after it
            schema_change_dml_after(conn, t, 400, change)
        conn.commit()
    _, delivered = cycle(topo)
    assert delivered["schema_changes"] == len(SYNTAX_TABLES)
    assert_in_sync(topo)
    for t in SYNTAX_TABLES:
        if expected is not None:
            assert (_subscriber_column(env, t, expected[0]) or "").startswith(expected[1]), t
        if change in ("drop", "rename"):
            assert _subscriber_column(env, t, "note") is None
    # the generated procedures were regenerated for the new columns (and the old ones dropped)
    procs = env.rows(
        env.sub,
        "SELECT proname, pg_get_function_identity_arguments(oid) FROM pg_proc WHERE proname = 'sp_MSins_publict_call'",
    )
    assert len(procs) == 1
    n_columns = env.rows(
        env.pub,
        "SELECT count(*) FROM pg_attribute WHERE attrelid = 't_call'::regclass AND attnum > 0 AND NOT attisdropped",
    )[0][0]
    assert procs[0][1].count("IN c") == n_columns
    # the next cycle is a plain one, with the new definitions
    with psycopg.connect(env.pub, autocommit=True) as conn:
        for t in SYNTAX_TABLES:
            schema_change_dml_after(conn, t, 500, change)
    cycle(topo)
    assert_in_sync(topo)


def test_existing_rows_get_the_publisher_s_default_and_a_stable_default_is_evaluated_once(env, spark):
    topo = _tables_env(env, spark, {"t_call": {}})
    schema_change(topo, "p", "ALTER TABLE t_call ADD COLUMN added_at timestamptz NOT NULL DEFAULT now()")
    cycle(topo)
    assert_in_sync(topo)
    pub = env.rows(env.pub, "SELECT DISTINCT added_at FROM t_call")
    assert env.rows(env.sub, "SELECT DISTINCT added_at FROM t_call") == pub and len(pub) == 1


def test_a_volatile_default_on_existing_rows_is_refused_and_nothing_changes(env, spark):
    topo = _tables_env(env, spark, {"t_call": {}})
    with pytest.raises(SchemaChangeError, match="volatile default"):
        schema_change(topo, "p", "ALTER TABLE t_call ADD COLUMN r double precision DEFAULT random()")
    assert _subscriber_column(env, "t_call", "r", env.pub) is None
    read, delivered = cycle(topo)
    assert read["transactions"] == 0 and delivered["transactions"] == 0


#: Refusals that need the publisher's catalog (those decided by the statement alone are unit tests).
BAD_CHANGES = [
    ("ALTER TABLE t_call ADD COLUMN a int, ADD COLUMN b int", "makes 2 changes"),
    ("ALTER TABLE t_call ALTER COLUMN qty TYPE smallint", "not a widening"),
    ("ALTER TABLE t_call ALTER COLUMN note TYPE varchar(5)", "not a widening"),
    ("ALTER TABLE t_call ALTER COLUMN qty TYPE text", "not a widening"),
    ("ALTER TABLE t_call DROP COLUMN id", "primary key"),
    ("ALTER TABLE t_call DROP COLUMN flt", "row filter"),
    ("ALTER TABLE t_call ALTER COLUMN flt TYPE bigint", "failed at the publisher"),
    ("ALTER TABLE unpublished ADD COLUMN a int", "not published by publication"),
    ("ALTER TABLE t_call DROP COLUMN nope", "has no column"),
    ("ALTER TABLE nowhere ADD COLUMN a int", "does not exist"),
]


def test_bad_schema_changes_are_one_clear_error_and_change_nothing(env, spark):
    env.run(env.pub, "CREATE TABLE unpublished (id int PRIMARY KEY)")
    env.run(
        env.pub,
        "CREATE TABLE t_call (id int PRIMARY KEY, qty int NOT NULL, note varchar(20), flt int);"
        "INSERT INTO t_call SELECT g, g, 'n', g FROM generate_series(1, 5) g",
    )
    topo = env.topology([{"table": "public.t_call", "row_filter": "flt > 0"}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    columns = (
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid IN "
        "('t_call'::regclass, 'unpublished'::regclass) AND attnum > 0 AND NOT attisdropped ORDER BY attrelid, attnum"
    )
    before = env.rows(env.pub, columns)
    for statement, message in BAD_CHANGES:
        with pytest.raises(SchemaChangeError) as err:
            schema_change(topo, "p", statement)
        assert message in str(err.value) and len(str(err.value).splitlines()) == 1, statement
        assert env.rows(env.pub, columns) == before, statement
    read, _ = cycle(topo)
    assert read["commands"] == 0  # no schema-change message was left behind


def test_a_change_made_behind_the_tool_s_back_stops_the_log_reader_naming_the_table(env, spark):
    topo = _tables_env(env, spark, {"t_call": {}})
    env.run(env.pub, "ALTER TABLE t_call ADD COLUMN sneaky int; INSERT INTO t_call VALUES (99, 1, 'x', 5)")
    with pytest.raises(
        ReplError, match=r"public\.t_call.*outside airflow-repl.*new column\(s\) \['sneaky'\].*schema-change"
    ):
        log_reader_agent.run_log_reader(topo, "p")
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.transactions") == [(0,)]


def test_a_batch_that_fails_with_its_copy_open_stores_nothing_and_says_why(env, spark):
    """The Log Reader streams a batch's command lines on one COPY kept open while it reads: a
    failure mid-batch ends that COPY with the error and raises the error itself (not the COPY's),
    and nothing of the batch is stored."""
    topo = _tables_env(env, spark, {"t_call": {}})
    env.run(env.pub, "INSERT INTO t_call SELECT g, 1, 'n' FROM generate_series(100, 140) g")
    env.run(env.pub, "ALTER TABLE t_call ADD COLUMN sneaky int; INSERT INTO t_call VALUES (99, 1, 'x', 5)")
    with pytest.raises(ReplError, match=r"public\.t_call.*outside airflow-repl.*new column\(s\) \['sneaky'\]"):
        log_reader_agent.run_log_reader(topo, "p", chunk=4)  # lines go out every 4 commands
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.commands") == [(0,)]
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.transactions") == [(0,)]


def test_a_column_retyped_behind_the_tool_s_back_stops_the_log_reader_too(env, spark):
    topo = _tables_env(env, spark, {"t_call": {}})
    env.run(env.pub, "ALTER TABLE t_call ALTER COLUMN qty TYPE numeric; UPDATE t_call SET qty = 1.5 WHERE id = 1")
    with pytest.raises(ReplError, match=r"another type for \['qty'\]"):
        log_reader_agent.run_log_reader(topo, "p")


def test_a_log_reader_crash_after_storing_a_schema_change_rereads_it_once(env, spark, monkeypatch):
    topo = _tables_env(env, spark, {"t_call": {}})
    env.run(env.pub, "INSERT INTO t_call VALUES (201, 1, 'before')")
    schema_change(topo, "p", "ALTER TABLE t_call ADD COLUMN c3 text DEFAULT 'd'")
    env.run(env.pub, "INSERT INTO t_call VALUES (202, 1, 'after', 'x')")

    def crash(*args, **kwargs):
        raise psycopg.OperationalError("crash between the distributor commit and the slot's confirmation")

    monkeypatch.setattr(log_reader_agent._LogReader, "confirm", crash)
    with pytest.raises(ReplError):
        log_reader_agent.run_log_reader(topo, "p")
    monkeypatch.undo()
    read = log_reader_agent.run_log_reader(topo, "p")  # the slot re-sends everything: all stored already
    assert read["transactions"] == 0
    env.run(env.pub, "INSERT INTO t_call VALUES (203, 1, 'later', 'y')")
    _, delivered = cycle(topo)
    assert delivered["schema_changes"] == 1
    assert env.rows(env.sub, "SELECT id, c3 FROM t_call WHERE id > 200 ORDER BY id") == [
        (201, "d"),
        (202, "x"),
        (203, "y"),
    ]
    assert_in_sync(topo)


def test_column_filters_keep_a_new_column_out_unless_asked(env, spark):
    env.run(env.pub, "CREATE TABLE f (id int PRIMARY KEY, a text, b text); INSERT INTO f VALUES (1, 'a', 'b')")
    topo = env.topology([{"table": "public.f", "columns": ["id", "a"]}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    schema_change(topo, "p", "ALTER TABLE f ADD COLUMN hidden text DEFAULT 'h'")
    schema_change(topo, "p", "ALTER TABLE f ADD COLUMN shown text DEFAULT 's'", include_in_filter=True)
    env.run(
        env.pub, "INSERT INTO f VALUES (2, 'a2', 'b2', 'h2', 's2'); UPDATE f SET shown = 'S', hidden = 'H' WHERE id = 1"
    )
    cycle(topo)
    assert _subscriber_column(env, "f", "hidden") is None
    assert env.rows(env.sub, "SELECT id, a, shown FROM f ORDER BY id") == [(1, "a", "S"), (2, "a2", "s2")]
    assert_in_sync(topo)


def test_subscribers_at_different_positions_each_get_the_changes_with_the_right_columns(env2, spark):
    env = env2
    topo = _tables_env(env, spark, {"t_call": {}})
    env.run(env.pub, "INSERT INTO t_call VALUES (101, 1, 'before first')")
    schema_change(topo, "p", "ALTER TABLE t_call ADD COLUMN c1 text")
    env.run(env.pub, "INSERT INTO t_call VALUES (102, 1, 'between', 'c1')")
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")  # sub1 past the first change, sub2 not
    schema_change(topo, "p", "ALTER TABLE t_call RENAME COLUMN note TO memo")
    env.run(env.pub, "INSERT INTO t_call VALUES (103, 1, 'after second', 'c1b')")
    log_reader_agent.run_log_reader(topo, "p")
    # neither subscriber (one behind both changes, one behind the second) needs reinitializing
    snapshot = snapshot_agent.run_snapshot(topo, "p", spark)
    assert snapshot["initialized"] == []
    for sub in ("sub1", "sub2"):
        distribution_agent.run_distribution(topo, "p", sub)
        assert_in_sync(topo, sub)
        assert _subscriber_column(env, "t_call", "memo", env.subs[sub]) == "character varying(20)"
    snapshot_agent.run_snapshot(topo, "p", spark)  # still none, once both have every change


def test_a_distribution_agent_killed_in_the_middle_of_a_schema_change_batch_resumes_exactly_once(env, spark, tmp_path):
    topo = _tables_env(env, spark, {"t_call": {}})
    # an ALWAYS trigger (it fires for replicated rows) that sleeps on the row after the change
    env.run(
        env.sub,
        """CREATE TABLE applied (id int);
        CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS
            $$BEGIN INSERT INTO applied VALUES (NEW.id); IF NEW.id = 777 THEN PERFORM pg_sleep(60); END IF; RETURN NEW; END$$;
        CREATE TRIGGER slow BEFORE INSERT ON t_call FOR EACH ROW EXECUTE FUNCTION slow();
        ALTER TABLE t_call ENABLE ALWAYS TRIGGER slow;""",
    )
    with psycopg.connect(env.pub) as conn:
        conn.execute("INSERT INTO t_call VALUES (700, 1, 'before')")
        schema_change(topo, "p", "ALTER TABLE t_call ADD COLUMN c2 int DEFAULT 3", connection=conn)
        conn.execute("INSERT INTO t_call VALUES (777, 1, 'after', 4)")
        conn.commit()
    log_reader_agent.run_log_reader(topo, "p")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(topo.to_dict(with_secrets=True)))
    proc = subprocess.Popen([sys.executable, AGENT_RUNNER, "distribution", str(spec)], env={**os.environ})
    deadline = time.monotonic() + 60
    while not env.rows(
        env.sub, "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'"
    ):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the server notices a dead client only when it next talks to it: end the orphaned session
    env.run(
        env.sub,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    time.sleep(0.5)
    assert _subscriber_column(env, "t_call", "c2") is None  # rolled back with the batch
    assert env.rows(env.sub, "SELECT count(*) FROM applied") == [(0,)]
    env.run(
        env.sub,
        "CREATE OR REPLACE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO applied VALUES (NEW.id); RETURN NEW; END$$",
    )
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT id FROM applied ORDER BY id") == [(700,), (777,)]
    assert env.rows(env.sub, "SELECT id, c2 FROM t_call WHERE id >= 700 ORDER BY id") == [(700, 3), (777, 4)]
    assert_in_sync(topo)


CUSTOM_PROCS = """
CREATE TABLE IF NOT EXISTS proc_log (what text);
CREATE PROCEDURE public.ins_c(a int, b int, c varchar) LANGUAGE plpgsql AS
$$BEGIN INSERT INTO c_t VALUES (a, b, c); INSERT INTO proc_log VALUES ('ins ' || a); END$$;
"""

SCRIPT = """
INSERT INTO script_runs VALUES (1);
DROP PROCEDURE IF EXISTS public.ins_c(int, int, varchar);
CREATE OR REPLACE PROCEDURE {{proc_ins}}(a int, b int, c varchar, d text) LANGUAGE plpgsql AS
$$BEGIN INSERT INTO {{table}} ({{columns}}) VALUES (a, b, c, d); INSERT INTO proc_log VALUES ('ins4 ' || a); END$$;
"""


def test_custom_procedures_need_a_registered_script_which_runs_at_each_subscriber(env2, spark, tmp_path):
    env = env2
    env.run(
        env.pub, "CREATE TABLE c_t (id int PRIMARY KEY, qty int, note varchar(20)); INSERT INTO c_t VALUES (1, 1, 'a')"
    )
    for sub in env.subs.values():
        env.run(sub, CUSTOM_PROCS)
    topo = env.topology([{"table": "public.c_t", "ins_cmd": "CALL public.ins_c"}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    with psycopg.connect(env.pub) as conn:
        conn.execute("INSERT INTO c_t VALUES (2, 2, 'before')")
        schema_change(topo, "p", "ALTER TABLE c_t ADD COLUMN d text", connection=conn)
        conn.execute("INSERT INTO c_t VALUES (3, 3, 'after', 'd3')")
        conn.commit()
    log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(
        DeliveryError, match=r"custom procedure .*ins_c.* register a script .*register-script.* or update the procedure"
    ):
        distribution_agent.run_distribution(topo, "p", "sub1")
    assert _subscriber_column(env, "c_t", "d") is None  # nothing of the batch stayed
    # a script that fails at sub2 only (its table script_runs is missing there)
    env.run(env.sub, "CREATE TABLE script_runs (n int)")
    with pytest.raises(Exception, match="unknown placeholder"):
        custom_scripting.register_script(topo, "p", "c_t", "sql", "SELECT {{nope}}")
    custom_scripting.register_script(topo, "p", "c_t", "sql", SCRIPT)
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT what FROM proc_log ORDER BY what") == [("ins 2",), ("ins4 3",)]
    with pytest.raises(DeliveryError, match=r"script registered for article 'c_t' failed at subscriber 'sub2'"):
        distribution_agent.run_distribution(topo, "p", "sub2")
    assert _subscriber_column(env, "c_t", "d", env.subs["sub2"]) is None
    env.run(env.subs["sub2"], "CREATE TABLE script_runs (n int)")
    distribution_agent.run_distribution(topo, "p", "sub2")
    assert env.rows(env.subs["sub2"], "SELECT what FROM proc_log ORDER BY what") == [("ins 2",), ("ins4 3",)]
    for sub in ("sub1", "sub2"):
        assert_in_sync(topo, sub)
    # on demand: the script runs again and the generated procedures are recreated
    env.run(env.sub, 'DROP PROCEDURE "sp_MSupd_publicc_t"')
    done = regenerate_procedures(topo, "p")
    assert done["subscribers"] == {"sub1": ["c_t"], "sub2": ["c_t"]}
    assert env.rows(env.sub, "SELECT count(*) FROM pg_proc WHERE proname IN ('sp_MSupd_publicc_t', 'ins_c')") == [(2,)]


def test_apply_and_the_snapshot_wait_for_the_log_reader_to_store_a_schema_change(env, spark):
    topo = _tables_env(env, spark, {"t_call": {}})
    env.run(env.pub, "INSERT INTO t_call VALUES (301, 1, 'before')")
    schema_change(topo, "p", "ALTER TABLE t_call ADD COLUMN c4 int DEFAULT 4")
    with pytest.raises(
        TopologyError, match=r"ADD COLUMN c4.*has not been read by the Log Reader yet: run the Log Reader"
    ):
        snapshot_agent.run_snapshot(topo, "p", spark, reinitialize=True)
    log_reader_agent.run_log_reader(topo, "p")
    snapshot_agent.run_snapshot(topo, "p", spark, reinitialize=True)  # now it may: the change is stored
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert_in_sync(topo)
    assert env.rows(env.pub, "SELECT count(*) FROM airflow_repl.schema_changes") == [(0,)]


def test_the_operators_change_the_schema_and_regenerate_procedures(env, spark, tmp_path):
    """Airflow is imported inside the test (see test_operator_failures.py)."""
    import yaml
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_repl.operators.schema import RegenerateProceduresOperator, SchemaChangeOperator

    topo = _tables_env(env, spark, {"t_call": {}})
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump({**env.servers(), **_publication_part("t_call")}))
    op = SchemaChangeOperator(
        task_id="add", topology=str(path), publication="p", sql="ALTER TABLE t_call ADD COLUMN op_col text"
    )
    assert op.execute({})["articles"] == ["p.t_call"]
    bad = SchemaChangeOperator(task_id="bad", topology=str(path), publication="p", sql="DROP TABLE t_call")
    with pytest.raises(AirflowFailException, match="not an ALTER TABLE"):
        bad.execute({})
    env.run(env.pub, "INSERT INTO t_call VALUES (501, 1, 'x', 'y')")
    cycle(topo)
    assert_in_sync(topo)
    env.run(env.sub, 'DROP PROCEDURE "sp_MSdel_publict_call"')
    regen = RegenerateProceduresOperator(task_id="regen", topology=str(path), publication="p")
    assert regen.execute({})["subscribers"] == {"sub1": ["t_call"]}
    assert env.rows(env.sub, "SELECT count(*) FROM pg_proc WHERE proname = 'sp_MSdel_publict_call'") == [(1,)]


def _publication_part(table):
    return {
        "publications": [{"name": "p", "articles": [{"table": f"public.{table}"}]}],
        "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
    }


def test_a_schema_change_asked_to_wait_for_quiescing_is_refused_while_a_subscription_is_behind(env, spark, tmp_path):
    from airflow_repl.engine.monitoring import tracer
    from airflow_repl.engine.monitoring.quiescing import require_quiesced

    topo = _tables_env(env, spark, {"t_call": {}})
    env.run(env.pub, "INSERT INTO t_call VALUES (601, 1, 'before the token')")
    token = tracer.post_tracer_token(topo, "p")
    log_reader_agent.run_log_reader(topo, "p")  # read, not delivered: sub1 is behind the token
    with pytest.raises(ReplError, match=rf"the schema change refused: .*not quiesced up to tracer token {token}.*sub1"):
        require_quiesced(topo, "p", token, "the schema change")
    distribution_agent.run_distribution(topo, "p", "sub1")
    require_quiesced(topo, "p", token, "the schema change")  # quiesced now: no error
