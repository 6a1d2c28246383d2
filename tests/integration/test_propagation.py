"""Every propagation method and call syntax, row and column filters, and updates delivered as
DELETE/INSERT pairs, end to end (log reader -> distribution -> a real PostgreSQL subscriber).
The seed documents' examples are tests here: the Vendor table, TABLE1 and the streams case."""

from __future__ import annotations

import re

import pytest
from harness import assert_in_sync, cycle

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.codegen import tsql_script
from airflow_repl.engine.errors import ReplError, TopologyError
from airflow_repl.engine.provisioning import deploy

VENDOR_DDL = """
CREATE SCHEMA "Purchasing";
CREATE TABLE "Purchasing"."Vendor" (
    "VendorID" int PRIMARY KEY, "AccountNumber" varchar(15) NOT NULL UNIQUE, "Name" varchar(50) NOT NULL,
    "CreditRating" smallint NOT NULL, "PreferredVendorStatus" boolean NOT NULL, "ActiveFlag" boolean NOT NULL,
    "PurchasingWebServiceURL" varchar(1024), "ModifiedDate" timestamp NOT NULL);
INSERT INTO "Purchasing"."Vendor" SELECT g, 'AW' || g, 'Vendor ' || g, 1, true, true, NULL, '2026-01-01'
FROM generate_series(1, 20) g;
"""

# The seed's generated procedures (propagation-methods.md), with the two types PostgreSQL has no
# equivalent for replaced: tinyint -> smallint, datetime -> datetime2.
SEED_TSQL = """
create procedure [sp_MSins_PurchasingVendor]
  @c1 int,@c2 nvarchar(15),@c3 nvarchar(50),@c4 smallint,@c5 bit,@c6 bit,@c7 nvarchar(1024),@c8 datetime2
as
begin
insert into [Purchasing].[Vendor]([VendorID]
,[AccountNumber]
,[Name]
,[CreditRating]
,[PreferredVendorStatus]
,[ActiveFlag]
,[PurchasingWebServiceURL]
,[ModifiedDate])
values (
 @c1
,@c2
,@c3
,@c4
,@c5
,@c6
,@c7
,@c8
 )
end
go
create procedure [sp_MSupd_PurchasingVendor]
 @c1 int = null,@c2 nvarchar(15) = null,@c3 nvarchar(50) = null,@c4 smallint = null,@c5 bit = null,@c6 bit = null,@c7 nvarchar(1024) = null,@c8 datetime2 = null,@pkc1 int
,@bitmap binary(2)
as
begin
update [Purchasing].[Vendor] set
 [AccountNumber] = case substring(@bitmap,1,1) & 2 when 2 then @c2 else [AccountNumber] end
,[Name] = case substring(@bitmap,1,1) & 4 when 4 then @c3 else [Name] end
,[CreditRating] = case substring(@bitmap,1,1) & 8 when 8 then @c4 else [CreditRating] end
,[PreferredVendorStatus] = case substring(@bitmap,1,1) & 16 when 16 then @c5 else [PreferredVendorStatus] end
,[ActiveFlag] = case substring(@bitmap,1,1) & 32 when 32 then @c6 else [ActiveFlag] end
,[PurchasingWebServiceURL] = case substring(@bitmap,1,1) & 64 when 64 then @c7 else [PurchasingWebServiceURL] end
,[ModifiedDate] = case substring(@bitmap,1,1) & 128 when 128 then @c8 else [ModifiedDate] end
where [VendorID] = @pkc1
if @@rowcount = 0
    if @@microsoftversion>0x07320000
        exec sp_MSreplraiserror 20598
end
go
create procedure [sp_MSdel_PurchasingVendor]
  @pkc1 int
as
begin
delete [Purchasing].[Vendor]
where [VendorID] = @pkc1
if @@rowcount = 0
    if @@microsoftversion>0x07320000
        exec sp_MSreplraiserror 20598
end
go
"""


def _lines(text: str) -> list[str]:
    return [
        re.sub(r"\s+", " ", ln).strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("--")
    ]


def vendor_env(env, spark, **options):
    env.run(env.pub, VENDOR_DDL)
    topo = env.topology([{"table": "Purchasing.Vendor", **options}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


def test_vendor_tsql_script_has_the_seed_structure(env):
    env.run(env.pub, VENDOR_DDL)
    topo = env.topology(["Purchasing.Vendor"])
    (art,) = deploy.apply_topology(topo)["p"]
    assert _lines(tsql_script.article_script(art)) == _lines(SEED_TSQL)


def test_vendor_default_procedures_are_created_and_called(env, spark):
    topo = vendor_env(env, spark)
    procs = dict(
        env.rows(
            env.sub,
            "SELECT p.proname, pg_get_function_identity_arguments(p.oid) FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'Purchasing'",
        )
    )
    assert procs["sp_MSins_PurchasingVendor"].startswith("IN c1 integer, IN c2 character varying")
    assert procs["sp_MSupd_PurchasingVendor"].endswith("IN pkc1 integer, IN bitmap bytea")
    assert procs["sp_MSdel_PurchasingVendor"] == "IN pkc1 integer"
    env.run(
        env.pub,
        """INSERT INTO "Purchasing"."Vendor" VALUES (21, 'AW21', 'New', 3, false, true, 'http://x', now());
        UPDATE "Purchasing"."Vendor" SET "CreditRating" = 5 WHERE "VendorID" = 2;
        DELETE FROM "Purchasing"."Vendor" WHERE "VendorID" = 3;""",
    )
    read, _ = cycle(topo)
    assert read["commands"] == 3
    assert_in_sync(topo)


@pytest.mark.parametrize(
    "syntax, keeps_local_change", [("SCALL", True), ("MCALL", True), ("CALL", False), ("XCALL", False)]
)
def test_update_syntax_sets_only_what_it_should(env, spark, syntax, keeps_local_change):
    """SCALL and MCALL set only the columns flagged in the bitmap; CALL and XCALL set all.  A
    column changed locally at the subscriber shows the difference."""
    topo = vendor_env(env, spark, upd_cmd=syntax)
    env.run(env.sub, """UPDATE "Purchasing"."Vendor" SET "Name" = 'local' WHERE "VendorID" = 4""")
    env.run(env.pub, """UPDATE "Purchasing"."Vendor" SET "CreditRating" = 9 WHERE "VendorID" = 4""")
    cycle(topo)
    name, rating = env.rows(
        env.sub,
        """SELECT "Name", "CreditRating" FROM "Purchasing"."Vendor"
                                        WHERE "VendorID" = 4""",
    )[0]
    assert rating == 9
    assert name == ("local" if keeps_local_change else "Vendor 4")


def test_xcall_custom_procedures_receive_before_and_after_images(env, spark):
    env.run(env.pub, "CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric)")
    env.run(env.pub, "INSERT INTO acct VALUES (1, 'ann', 10), (2, 'bob', 20)")
    env.run(
        env.sub,
        """
        CREATE TABLE audit (what text, old_owner text, old_balance numeric, new_owner text, new_balance numeric);
        CREATE PROCEDURE public.upd_acct(o_id int, o_owner text, o_bal numeric, n_id int, n_owner text, n_bal numeric)
        LANGUAGE plpgsql AS $$BEGIN
            UPDATE acct SET owner = n_owner, balance = n_bal WHERE id = o_id;
            INSERT INTO audit VALUES ('U', o_owner, o_bal, n_owner, n_bal);
        END$$;
        CREATE PROCEDURE public.del_acct(o_id int, o_owner text, o_bal numeric)
        LANGUAGE plpgsql AS $$BEGIN
            DELETE FROM acct WHERE id = o_id;
            INSERT INTO audit VALUES ('D', o_owner, o_bal, NULL, NULL);
        END$$;""",
    )
    # the snapshot drops and recreates acct at the subscriber; the procedures stay
    topo = env.topology(
        [{"table": "public.acct", "upd_cmd": "XCALL public.upd_acct", "del_cmd": "XCALL public.del_acct"}]
    )
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "UPDATE acct SET balance = balance + 5 WHERE id = 1; DELETE FROM acct WHERE id = 2")
    cycle(topo)
    assert env.rows(env.sub, "SELECT * FROM audit ORDER BY what DESC") == [
        ("U", "ann", 10, "ann", 15),
        ("D", "bob", 20, None, None),
    ]
    assert_in_sync(topo)
    # no generated procedure exists for operations that use custom ones
    assert [r[0] for r in env.rows(env.sub, "SELECT proname FROM pg_proc WHERE proname LIKE 'sp_MS%' ORDER BY 1")] == [
        "sp_MSins_publicacct"
    ]


def test_mcall_custom_procedure_receives_the_bitmask(env, spark):
    env.run(env.pub, "CREATE TABLE t (id int PRIMARY KEY, a text, b text, c text)")
    env.run(env.pub, "INSERT INTO t VALUES (1, 'a', 'b', 'c')")
    env.run(
        env.sub,
        """
        CREATE TABLE masks (m bytea);
        CREATE PROCEDURE upd_t(id int, a text, b text, c text, pk int, mask bytea) LANGUAGE plpgsql AS
        $$BEGIN UPDATE t SET a = $2, b = $3, c = $4 WHERE t.id = pk; INSERT INTO masks VALUES (mask); END$$;""",
    )
    topo = env.topology([{"table": "t", "upd_cmd": "MCALL upd_t"}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "UPDATE t SET c = 'z', a = 'y' WHERE id = 1")
    cycle(topo)
    assert env.rows(env.sub, "SELECT m FROM masks") == [(bytes([0b1010]),)]  # columns 2 and 4
    assert_in_sync(topo)


def test_missing_custom_procedure_is_named_and_nothing_is_lost(env, spark):
    env.run(env.pub, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'x')")
    topo = env.topology([{"table": "t", "ins_cmd": "CALL custom.ins_t"}])
    with pytest.raises(
        ReplError,
        match=r"custom procedure custom.ins_t .*insert command of article 't'.*"
        r"does not exist at subscriber 'sub1'",
    ):
        snapshot_agent.run_snapshot(topo, "p", spark)
    # checked before anything changed: nothing deployed, no subscription left initializing
    assert env.rows(env.dist, "SELECT to_regclass('airflow_repl.subscriptions')") == [(None,)]
    env.run(env.pub, "INSERT INTO t VALUES (2, 'written meanwhile')")
    env.run(
        env.sub,
        "CREATE SCHEMA custom; CREATE PROCEDURE custom.ins_t(i int, v text) LANGUAGE plpgsql "
        "AS $$BEGIN INSERT INTO t VALUES (i, v); END$$",
    )
    snapshot_agent.run_snapshot(topo, "p", spark)  # the subscription is initialized on the next run
    env.run(env.pub, "INSERT INTO t VALUES (3, 'after')")
    cycle(topo)
    assert_in_sync(topo)


def test_custom_procedure_with_the_wrong_parameters_is_rejected_before_anything_changes(env, spark):
    env.run(env.pub, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'x')")
    env.run(
        env.sub,
        "CREATE TABLE t (id int PRIMARY KEY, v text, local text); INSERT INTO t VALUES (9, 'mine', 'l');"
        "CREATE PROCEDURE upd_t(a int, b text) LANGUAGE plpgsql AS $$BEGIN END$$",
    )
    topo = env.topology([{"table": "t", "upd_cmd": "XCALL upd_t"}])
    with pytest.raises(
        ReplError,
        match=r"custom procedure public.upd_t .* takes 2 parameter\(s\), but XCALL syntax "
        r"passes 4: c1 integer, c2 text, c3 integer, c4 text",
    ):
        snapshot_agent.run_snapshot(topo, "p", spark)
    assert env.rows(env.sub, "SELECT * FROM t") == [(9, "mine", "l")]  # the subscriber table is untouched


def test_sql_statements_and_none(env, spark):
    env.run(env.pub, "CREATE TABLE t (id int PRIMARY KEY, v text, n int)")
    env.run(env.pub, "INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 10) g")
    topo = env.topology([{"table": "t", "ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "NONE"}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    assert env.rows(env.sub, "SELECT count(*) FROM pg_proc WHERE proname LIKE 'sp_MS%'") == [(0,)]
    env.run(
        env.pub,
        "INSERT INTO t VALUES (11, 'new', 11); UPDATE t SET v = 'upd' WHERE id = 2; DELETE FROM t WHERE id IN (3, 4)",
    )
    read, delivered = cycle(topo)
    assert read["commands"] == 4 and delivered["commands"] == 2  # the deletes are not delivered
    assert env.rows(env.sub, "SELECT id, v FROM t WHERE id IN (2, 3, 4, 11) ORDER BY id") == [
        (2, "upd"),
        (3, "v3"),
        (4, "v4"),
        (11, "new"),
    ]
    # a SQL-statement update that finds no row raises the same row-not-found error
    env.run(env.sub, "DELETE FROM t WHERE id = 5")
    env.run(env.pub, "UPDATE t SET v = 'gone' WHERE id = 5")
    log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(ReplError, match=r"update on article 't' \(public.t\) key \(id=5\).*row not found"):
        distribution_agent.run_distribution(topo, "p", "sub1")


# ---------------------------------------------------------------------- TABLE1 (KB 238254)
TABLE1 = (
    "CREATE TABLE table1 (col1 int PRIMARY KEY, col2 int, col3 varchar(30)); "
    "INSERT INTO table1 VALUES (1, 1, 'Dallas'), (2, 2, 'Austin')"
)


def test_table1_key_update_is_a_delete_insert_pair(env, spark):
    env.run(env.pub, TABLE1)
    topo = env.topology(["table1"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "UPDATE table1 SET col1 = 3 WHERE col3 = 'Dallas'")
    log_reader_agent.run_log_reader(topo, "p")
    assert env.rows(env.dist, "SELECT op, data->'o', data->'n' FROM airflow_repl.commands ORDER BY command_id") == [
        ("D", ["1", "1", "Dallas"], None),
        ("I", None, ["3", "1", "Dallas"]),
    ]
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT * FROM table1 ORDER BY col1") == [(2, 2, "Austin"), (3, 1, "Dallas")]


def test_table1_dallas_filter_transitions(env, spark):
    env.run(env.pub, TABLE1)
    topo = env.topology([{"table": "table1", "row_filter": "col3 = 'Dallas'"}])
    snap = snapshot_agent.run_snapshot(topo, "p", spark)
    assert snap["rows"] == 1
    assert env.rows(env.sub, "SELECT * FROM table1") == [(1, 1, "Dallas")]

    def commands():
        log_reader_agent.run_log_reader(topo, "p")
        rows = env.rows(
            env.dist,
            "SELECT op FROM airflow_repl.commands WHERE xact_seqno > "
            "coalesce((SELECT max(delivered_xact_seqno) FROM airflow_repl.subscriptions), "
            "'0/0') ORDER BY xact_seqno, command_id",
        )
        distribution_agent.run_distribution(topo, "p", "sub1")
        return [r[0] for r in rows]

    env.run(env.pub, "UPDATE table1 SET col1 = 3 WHERE col3 = 'Dallas'")
    assert commands() == ["D", "I"]
    env.run(env.pub, "UPDATE table1 SET col3 = 'New York' WHERE col1 = 3")  # leaves the filter
    assert commands() == ["D"]
    assert env.rows(env.sub, "SELECT count(*) FROM table1") == [(0,)]
    env.run(env.pub, "UPDATE table1 SET col3 = 'Dallas' WHERE col1 = 3")  # enters the filter
    assert commands() == ["I"]
    env.run(env.pub, "UPDATE table1 SET col2 = 7 WHERE col1 = 2")  # outside before and after
    assert commands() == []
    env.run(env.pub, "UPDATE table1 SET col3 = NULL WHERE col1 = 3")  # NULL fails the filter
    assert commands() == ["D"]
    env.run(env.pub, "UPDATE table1 SET col3 = 'Dallas' WHERE col1 = 2")
    assert commands() == ["I"]
    assert env.rows(env.sub, "SELECT * FROM table1") == [(2, 7, "Dallas")]


@pytest.mark.parametrize(
    "row_filter, message",
    [
        ("nope = 1", r'row_filter of article .table1. \(public.table1\) is rejected by the publisher: column "nope"'),
        ("col3 = ", "rejected by the publisher: syntax error"),
        ("true) , TABLE other WHERE (true", "unbalanced parentheses"),
        ("col1 = 1; DROP TABLE table1", "';' is not allowed"),
        ("col1 = 1 -- comment", "comments are not allowed"),
        ("random() > 0.5", "rejected"),
        # '$' inside identifiers must not open a dollar quote that hides a ';'
        ("EXISTS (SELECT 1 AS a$$t$)) ; DROP TABLE table1 ; SELECT ((SELECT 1 AS b$$t$)", "not a valid predicate"),
        ("EXISTS (SELECT 1 AS a$$t$) ; DROP TABLE table1 ; SELECT (SELECT 1 AS b$$t$)", "';' is not allowed"),
        ("col3 = $q$x$q$) , TABLE table1 WHERE (true", "unbalanced parentheses"),
    ],
)
def test_bad_row_filters_are_rejected_up_front(env, row_filter, message):
    env.run(env.pub, TABLE1)
    with pytest.raises(TopologyError, match=message):
        deploy.apply_topology(env.topology([{"table": "table1", "row_filter": row_filter}]))
    assert env.rows(env.pub, "SELECT count(*) FROM pg_publication") == [(0,)]
    assert env.rows(env.pub, "SELECT count(*) FROM table1") == [(2,)]


def test_column_filter_keeps_the_key_and_follows_filtered_ordinals(env, spark):
    env.run(env.pub, "CREATE TABLE wide (a text, id int PRIMARY KEY, b text, secret text, c text)")
    env.run(env.pub, "INSERT INTO wide VALUES ('a', 1, 'b', 's', 'c')")
    topo = env.topology([{"table": "wide", "columns": ["a", "c", "b"]}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    assert env.rows(
        env.sub,
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'wide' ORDER BY ordinal_position",
    ) == [("a",), ("id",), ("b",), ("c",)]
    env.run(env.pub, "UPDATE wide SET c = 'C', secret = 'S2' WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    assert env.rows(env.dist, "SELECT data->'n' FROM airflow_repl.commands") == [(["a", "1", "b", "C"],)]
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert_in_sync(topo)
    with pytest.raises(TopologyError, match=r"column filter of article 'wide'.*no column 'nope'"):
        deploy.apply_topology(env.topology([{"table": "wide", "columns": ["a", "nope"]}]))


# ---------------------------------------------------------------------- key updates
def test_multi_row_key_updates_and_swaps_apply_without_uniqueness_errors(env, spark):
    env.run(
        env.pub,
        """
        CREATE TABLE k (id int PRIMARY KEY DEFERRABLE, code text UNIQUE DEFERRABLE, v text);
        INSERT INTO k SELECT g, 'c' || g, 'v' || g FROM generate_series(1, 50) g;""",
    )
    topo = env.topology(["k"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "UPDATE k SET id = id + 1")  # every key moves onto the next one
    env.run(env.pub, "UPDATE k SET id = CASE id WHEN 2 THEN 3 WHEN 3 THEN 2 END WHERE id IN (2, 3)")  # swap
    env.run(
        env.pub, "UPDATE k SET code = CASE code WHEN 'c5' THEN 'c6' ELSE 'c5' END WHERE code IN ('c5', 'c6')"
    )  # swap of a unique non-key column
    env.run(
        env.pub,
        "BEGIN; UPDATE k SET id = 100 WHERE id = 10; UPDATE k SET id = 101 WHERE id = 100; "
        "UPDATE k SET id = 10 WHERE id = 11; COMMIT",
    )  # a chain of statements in one transaction
    read, delivered = cycle(topo)
    assert read["transactions"] == 4 and delivered["transactions"] == 4
    assert_in_sync(topo)


def test_every_update_as_pair_and_single_row_key_updates_as_update(env, spark):
    env.run(
        env.pub,
        """
        CREATE TABLE a (id int PRIMARY KEY, v text); INSERT INTO a SELECT g, 'x' FROM generate_series(1, 5) g;
        CREATE TABLE b (id int PRIMARY KEY, v text); INSERT INTO b SELECT g, 'x' FROM generate_series(1, 5) g;""",
    )
    topo = env.topology(
        [
            {"table": "a", "updates_as_delete_insert": "all"},
            {"table": "b", "updates_as_delete_insert": "multi_row_key_changes"},
        ]
    )
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(
        env.sub,
        """
        CREATE TABLE ops (tbl text, op text);
        CREATE FUNCTION rec() RETURNS trigger LANGUAGE plpgsql AS
            $$BEGIN INSERT INTO ops VALUES (TG_TABLE_NAME, TG_OP); RETURN NULL; END$$;
        CREATE TRIGGER ra AFTER INSERT OR UPDATE OR DELETE ON a FOR EACH ROW EXECUTE FUNCTION rec();
        CREATE TRIGGER rb AFTER INSERT OR UPDATE OR DELETE ON b FOR EACH ROW EXECUTE FUNCTION rec();
        ALTER TABLE a ENABLE ALWAYS TRIGGER ra; ALTER TABLE b ENABLE ALWAYS TRIGGER rb;""",
    )
    env.run(env.pub, "UPDATE a SET v = 'y' WHERE id = 1")  # non-key update, delivered as a pair
    env.run(env.pub, "UPDATE b SET id = 10 WHERE id = 1")  # single-row key update: one UPDATE
    env.run(env.pub, "UPDATE b SET id = id + 100 WHERE id IN (2, 3)")  # multi-row: pairs
    cycle(topo)
    ops = env.rows(env.sub, "SELECT tbl, op FROM ops")
    assert ops[:3] == [("a", "DELETE"), ("a", "INSERT"), ("b", "UPDATE")]
    assert sorted(ops[3:]) == [("b", "DELETE"), ("b", "DELETE"), ("b", "INSERT"), ("b", "INSERT")]
    assert_in_sync(topo)


# ---------------------------------------------------------------------- Distribution Agent options
def test_commit_batch_size_and_threshold(env, spark):
    env.run(
        env.pub, "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t SELECT g, 0 FROM generate_series(1, 100) g"
    )
    topo = env.topology(["t"], commit_batch_size=4, commit_batch_threshold=1000)
    snapshot_agent.run_snapshot(topo, "p", spark)
    for i in range(10):
        env.run(env.pub, "UPDATE t SET v = v + 1 WHERE id <= %s", (1 + i,))
    log_reader_agent.run_log_reader(topo, "p")
    assert distribution_agent.run_distribution(topo, "p", "sub1")["commits"] == 3  # 4 + 4 + 2 transactions
    env.run(env.pub, "UPDATE t SET v = 5 WHERE id <= 30")  # 30 commands
    env.run(env.pub, "UPDATE t SET v = 6 WHERE id <= 30")
    env.run(env.pub, "UPDATE t SET v = 7 WHERE id <= 30")
    log_reader_agent.run_log_reader(topo, "p")
    result = distribution_agent.run_distribution(topo, "p", "sub1", commit_batch_threshold=50)
    assert (result["transactions"], result["commits"]) == (3, 3)  # a batch closes before 50 commands
    assert_in_sync(topo)


def test_streams_seed_case_stays_on_one_stream(env, spark):
    """pk 1 -> 2, then 2 -> 3, in two transactions, over two streams (SQL Server's
    SubscriptionStreams example), in a batch large enough to be spread: the planner keeps the
    chain on one stream, so nothing waits, fails or replays."""
    env.run(
        env.pub,
        "CREATE TABLE s (pk int PRIMARY KEY, v text); INSERT INTO s VALUES (1, 'row'), (50, 'other'); "
        "INSERT INTO s SELECT g, 'filler' FROM generate_series(100, 299) g",
    )
    topo = env.topology(
        [{"table": "s", "updates_as_delete_insert": "multi_row_key_changes", "upd_cmd": "CALL"}], subscription_streams=2
    )
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "UPDATE s SET pk = 2 WHERE pk = 1")
    env.run(env.pub, "UPDATE s SET pk = 3000 WHERE pk = 2")
    env.run(env.pub, "UPDATE s SET v = 'still' WHERE pk = 50")
    env.run(env.pub, "UPDATE s SET v = 'spread' WHERE pk BETWEEN 100 AND 299")
    log_reader_agent.run_log_reader(topo, "p")
    result = distribution_agent.run_distribution(topo, "p", "sub1")
    assert (result["retries"], result["transactions"], result["skipped"], result["parallel_batches"]) == (0, 4, 0, 1)
    assert env.rows(env.sub, "SELECT * FROM s WHERE v <> 'spread' ORDER BY pk") == [(50, "still"), (3000, "row")]
    assert env.rows(env.sub, "SELECT count(*) FROM s WHERE v = 'spread'") == [(200,)]
    assert env.rows(env.sub, "SELECT count(*) FROM pg_prepared_xacts") == [(0,)]


def test_streams_spread_a_batch_and_commit_it_atomically(env, spark):
    env.run(
        env.pub, "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t SELECT g, 0 FROM generate_series(1, 2000) g"
    )
    topo = env.topology(["t"], subscription_streams=3, commit_batch_size=5)
    snapshot_agent.run_snapshot(topo, "p", spark)
    for i in range(20):
        env.run(env.pub, "UPDATE t SET v = v + 1 WHERE id %% 20 = %s", (i,))
    log_reader_agent.run_log_reader(topo, "p")
    result = distribution_agent.run_distribution(topo, "p", "sub1")
    assert (result["transactions"], result["commands"], result["commits"], result["retries"]) == (20, 2000, 4, 0)
    assert result["parallel_batches"] >= 1  # the first batch is spread (later ones only while that is faster)
    assert env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state") == [(20,)]
    assert_in_sync(topo)


def test_skip_errors_skip_only_the_failing_transaction(env, spark):
    env.run(
        env.pub,
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g",
    )
    topo = env.topology(["t"], skip_errors=["row_not_found", "2627"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.sub, "DELETE FROM t WHERE id = 3; INSERT INTO t VALUES (20, 'local')")
    env.run(env.pub, "UPDATE t SET v = 'a' WHERE id = 1")
    env.run(env.pub, "BEGIN; UPDATE t SET v = 'b' WHERE id = 2; UPDATE t SET v = 'c' WHERE id = 3; COMMIT")
    env.run(env.pub, "INSERT INTO t VALUES (20, 'publisher')")  # duplicate key at the subscriber
    env.run(env.pub, "UPDATE t SET v = 'd' WHERE id = 4")
    _read, delivered = cycle(topo)
    assert (delivered["transactions"], delivered["skipped"]) == (4, 2)
    # the skipped transactions applied nothing (not even id 2 of the second); the others applied
    assert env.rows(env.sub, "SELECT id, v FROM t WHERE id IN (1, 2, 4, 20) ORDER BY id") == [
        (1, "a"),
        (2, "v"),
        (4, "d"),
        (20, "local"),
    ]
    errors = env.rows(
        env.dist,
        "SELECT article, sqlstate, skipped, command->'n', message FROM airflow_repl.errors ORDER BY xact_seqno",
    )
    assert [e[:3] for e in errors] == [("t", "RP598", True), ("t", "23505", True)]
    assert "key (id=3)" in errors[0][4] and "key (id=20)" in errors[1][4]


def test_unknown_skip_error_name_is_rejected(env):
    with pytest.raises(TopologyError, match=r"skip_errors .* must list some of: row_not_found"):
        env.topology(["t"], skip_errors=["everything"])
