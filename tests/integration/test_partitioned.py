"""A partitioned table published as one article (``publish_via_partition_root``), against real
servers, with PostgreSQL's native logical replication of the same table as the oracle.

The publisher's ``events`` is partitioned by range of a date, three partitions at first.  The
snapshot reads its partitions in parallel (block ranges of every partition) into a plain table
at the subscriber; then changes in every partition (a row moving to another partition by an
update of the partition key among them), a partition created and one attached after the
snapshot (whose rows' later changes flow), one detached and one dropped (their rows stay at
the subscriber, their later changes do not flow) are replicated, and the subscriber is
compared row by row with the native subscriber, which received the very same changes, and with
the publisher.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from harness import assert_in_sync, cycle, diff, drop_native_subscription, resolved_topology, wait_native
from psycopg import sql

from airflow_repl.engine.agents import log_reader_agent, snapshot_agent, snapshot_folder
from airflow_repl.engine.errors import ReplError, TopologyError
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.provisioning import deploy, schema_change
from airflow_repl.engine.subscriber import validation

COLUMNS = ["d", "id", "v", "n"]
EVENTS = """
    CREATE TABLE events (d date NOT NULL, id int NOT NULL, v text, n int, PRIMARY KEY (d, id))
        PARTITION BY RANGE (d);
    CREATE TABLE events_2024_01 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2024-02-01');
    CREATE TABLE events_2024_02 PARTITION OF events FOR VALUES FROM ('2024-02-01') TO ('2024-03-01');
    CREATE TABLE events_2024_03 PARTITION OF events FOR VALUES FROM ('2024-03-01') TO ('2024-04-01');
    INSERT INTO events SELECT DATE '2024-01-01' + (g % 90), g, 'v' || g, g % 7 FROM generate_series(1, 3000) g;
"""
#: a partition created after the snapshot, with a name to quote
QUOTED_PARTITION = (
    'CREATE TABLE "Events ""Q2""" PARTITION OF events FOR VALUES FROM (\'2024-04-01\') TO (\'2024-07-01\');'
)
#: the native subscriber's table: plain, as airflow-repl's subscriber table
NATIVE_TABLE = "CREATE TABLE events (d date NOT NULL, id int NOT NULL, v text, n int, PRIMARY KEY (d, id))"


def rows(conninfo: str, query: str = "SELECT d, id, v, n FROM events") -> list[tuple]:
    """The rows of ``query`` (test text), each value as text, sorted."""
    with connections.connect(conninfo, "server", autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL(query))  # the test's own text
        return sorted(tuple(None if v is None else str(v) for v in r) for r in cur.fetchall())


def snapshotted_events(env, spark, options: dict | None = None):
    """``events`` at the publisher, published by article 'events' (with ``options``) and
    snapshotted to the subscriber; returns the topology."""
    env.run(env.pub, EVENTS)
    topo = env.topology([{"table": "public.events", **(options or {})}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


@pytest.fixture
def native(env, sandbox):
    """A native subscription of ``events`` (publish_via_partition_root) into a plain table of
    another database of the subscriber cluster."""
    name = f"native_{env.databases[0][1]}"
    conninfo = sandbox.create_database("subscriber", name, recreate=True)
    env.databases.append(("subscriber", name))
    env.run(conninfo, NATIVE_TABLE)
    yield conninfo
    drop_native_subscription(conninfo, name)


def subscribe_natively(env, native: str) -> str:
    name = f"native_{env.databases[0][1]}"
    env.run(env.pub, f"CREATE PUBLICATION {name} FOR TABLE events WITH (publish_via_partition_root = true)")
    with psycopg.connect(native, autocommit=True) as sub:
        sub.execute(
            sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (slot_name = {})").format(
                sql.Identifier(name), sql.Literal(env.pub), sql.Identifier(name), sql.Literal(name)
            )
        )
    return name


def test_a_partitioned_table_replicates_as_one_table_like_native_replication(env, spark, native, monkeypatch):
    env.run(env.pub, EVENTS)
    topo = env.topology(["public.events"])
    monkeypatch.setattr(snapshot_folder, "ROWS_PER_PARTITION", 500)  # several block ranges of 3,000 rows
    taken = snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=3)
    oracle = subscribe_natively(env, native)

    # the snapshot: its three block ranges each read rows of every partition, in parallel tasks
    assert taken["partitions"] == 3 and taken["tables"] == {"public.events": 3000}
    manifest = json.loads((Path(taken["folder"]) / "manifest.json").read_text())
    files = manifest["articles"][0]["files"]
    assert len(files) == 3 and all(f["rows"] > 0 for f in files)
    (by_file,) = [
        env.rows(
            env.pub,
            "SELECT count(DISTINCT tableoid) FROM events WHERE ctid >= %s::tid AND ctid < %s::tid",
            (f"({files[1]['lower']},0)", f"({files[1]['upper']},0)"),
        )
    ]
    assert by_file == [(3,)]  # the middle range: rows of the three partitions
    assert env.rows(env.sub, "SELECT relkind FROM pg_class WHERE oid = 'events'::regclass") == [("r",)]
    assert env.rows(
        env.pub,
        "SELECT relname, relreplident FROM pg_class WHERE relname LIKE 'events%' AND relkind IN ('r', 'p') ORDER BY 1",
    ) == [("events", "f"), ("events_2024_01", "f"), ("events_2024_02", "f"), ("events_2024_03", "f")]
    assert rows(env.sub) == rows(env.pub)

    # changes in every partition, a row moving to another partition
    env.run(
        env.pub,
        """
        INSERT INTO events VALUES ('2024-01-31', 5001, 'jan', 1), ('2024-02-29', 5002, 'feb', 2),
                                  ('2024-03-31', 5003, 'mar', 3);
        UPDATE events SET v = v || '!' WHERE id % 100 = 0;
        UPDATE events SET n = NULL WHERE d IN ('2024-01-05', '2024-02-05', '2024-03-05');
        DELETE FROM events WHERE id % 250 = 1;
        UPDATE events SET d = '2024-03-15' WHERE id = 10;   -- January -> March
        UPDATE events SET d = d + 31 WHERE id IN (20, 21);  -- into the next month's partition
        """,
    )
    cycle(topo)
    assert_in_sync(topo)

    # a partition created after the snapshot (the default replica identity), and one attached,
    # made apart with its columns in another order and a dropped column; their rows flow
    env.run(
        env.pub,
        """
        CREATE TABLE events_2024_04 PARTITION OF events FOR VALUES FROM ('2024-04-01') TO ('2024-05-01');
        CREATE TABLE events_2024_05 (gone int, n int, v text, id int NOT NULL, d date NOT NULL);
        ALTER TABLE events_2024_05 DROP COLUMN gone;
        ALTER TABLE events ATTACH PARTITION events_2024_05 FOR VALUES FROM ('2024-05-01') TO ('2024-06-01');
        INSERT INTO events SELECT DATE '2024-04-01' + (g % 61), 6000 + g, 'new' || g, g FROM generate_series(1, 200) g;
        """,
    )
    assert env.rows(
        env.pub, "SELECT relreplident FROM pg_class WHERE relname IN ('events_2024_04', 'events_2024_05')"
    ) == [("d",), ("d",)]
    cycle(topo)  # the inserts flow; the Log Reader gives the new partitions REPLICA IDENTITY FULL
    assert env.rows(
        env.pub, "SELECT relreplident FROM pg_class WHERE relname IN ('events_2024_04', 'events_2024_05')"
    ) == [("f",), ("f",)]
    env.run(
        env.pub,
        """
        UPDATE events SET v = 'changed', n = NULL WHERE id BETWEEN 6001 AND 6200 AND id % 3 = 0;
        DELETE FROM events WHERE id BETWEEN 6001 AND 6200 AND id % 5 = 0;
        UPDATE events SET d = '2024-01-02' WHERE id = 6010;  -- April (created) -> January
        UPDATE events SET d = '2024-03-30' WHERE id = 6042;  -- May (attached) -> March
        UPDATE events_2024_05 SET v = 'through the partition' WHERE id = 6041;
        """,
    )
    cycle(topo)
    assert_in_sync(topo)

    # a partition detached and one dropped: their rows stay at the subscriber, as natively, and
    # the detached table's later changes do not flow
    env.run(
        env.pub,
        """
        ALTER TABLE events DETACH PARTITION events_2024_02;
        UPDATE events_2024_02 SET v = 'after the detach';
        DELETE FROM events_2024_02 WHERE id % 2 = 0;
        DROP TABLE events_2024_03;
        INSERT INTO events VALUES ('2024-01-20', 7000, 'after', 0);
        """,
    )
    cycle(topo)
    wait_native(env.pub, native, oracle)
    ours, theirs = rows(env.sub), rows(native)
    assert not diff("subscriber vs native subscriber", COLUMNS, theirs, ours)
    assert len(ours) > 3000
    kept = rows(env.sub, "SELECT d, id, v, n FROM events WHERE d >= '2024-02-01' AND d < '2024-04-01'")
    assert len(kept) > 1500 and all(v != "after the detach" for _, _, v, _ in kept)
    assert ours == sorted(rows(env.pub) + kept)

    # validation: the rows of the detached and dropped partitions are extra at the subscriber
    (line,) = validation.compare(topo, "p", "sub1")
    assert (line["missing"], line["extra"], line["different"]) == (0, len(kept), 0)
    assert line["publisher_rows"] == len(rows(env.pub))


def test_validation_of_a_partitioned_article_reads_its_partitions_in_ranges(env, spark, monkeypatch):
    topo = snapshotted_events(env, spark)
    monkeypatch.setattr(validation, "BLOCKS_PER_TASK", 4)  # several tasks over every partition
    assert_in_sync(topo)
    env.run(env.sub, "UPDATE events SET v = 'x' WHERE id = 17; DELETE FROM events WHERE id = 18")
    env.run(env.sub, "INSERT INTO events VALUES ('2030-01-01', 1, 'only here', 0)")
    (line,) = validation.compare(topo, "p", "sub1")
    assert (line["publisher_rows"], line["missing"], line["extra"], line["different"]) == (3000, 1, 1, 1)


def test_row_and_column_filters_and_a_schema_change_of_a_partitioned_article(env, spark):
    topo = snapshotted_events(env, spark, {"row_filter": "n < 3", "columns": ["d", "id", "n"]})
    filtered = "SELECT d, id, n FROM events WHERE n < 3"
    assert rows(env.sub, "SELECT d, id, n FROM events") == rows(env.pub, filtered)
    env.run(
        env.pub,
        """
        UPDATE events SET n = 5 WHERE id IN (7, 14);          -- leave the filter
        UPDATE events SET n = 0 WHERE id IN (3, 4);           -- enter it
        UPDATE events SET d = '2024-03-20', n = 1 WHERE id = 1;  -- another partition, still in it
        UPDATE events SET v = 'not replicated' WHERE n < 3;
        INSERT INTO events VALUES ('2024-02-10', 8000, 'in', 2), ('2024-02-11', 8001, 'out', 4);
        """,
    )
    cycle(topo)
    assert rows(env.sub, "SELECT d, id, n FROM events") == rows(env.pub, filtered)
    assert_in_sync(topo)
    schema_change.schema_change(topo, "p", "ALTER TABLE events ADD COLUMN note text", include_in_filter=True)
    env.run(env.pub, "UPDATE events SET note = 'noted' WHERE id IN (2, 3, 8000)")
    cycle(topo)
    assert env.rows(env.sub, "SELECT id, note FROM events WHERE note IS NOT NULL ORDER BY id") == [
        (2, "noted"),
        (3, "noted"),
        (8000, "noted"),
    ]
    assert_in_sync(topo)


def test_the_truncate_of_a_partitioned_table_is_replicated(env, spark):
    topo = snapshotted_events(env, spark)
    env.run(env.pub, "TRUNCATE events; INSERT INTO events VALUES ('2024-03-03', 1, 'after', 1)")
    cycle(topo)
    assert env.rows(env.sub, "SELECT id, v FROM events") == [(1, "after")]


def test_a_partition_changed_before_it_has_full_replica_identity_stops_the_log_reader(env, spark):
    topo = snapshotted_events(env, spark)
    env.run(
        env.pub,
        QUOTED_PARTITION
        + """
        INSERT INTO events VALUES ('2024-04-02', 9000, 'new', 1), ('2024-01-02', 9001, 'old', 1);
        UPDATE events SET v = 'changed' WHERE id = 9000;
        """,
    )
    with pytest.raises(
        ReplError,
        match=r"the update of a row of partitioned table public.events \(article 'events'\) may come from "
        r"partition\(s\) public.Events \"Q2\" \(REPLICA IDENTITY DEFAULT\).*drop the publication's slot and run "
        r"the Snapshot Agent with reinitialize",
    ):
        log_reader_agent.run_log_reader(topo, "p")
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.commands") == [(0,)]


def test_deletes_and_key_updates_of_a_partition_with_the_default_identity_flow_by_key(env, spark):
    """A partition created after the snapshot logs only the key of a before image until it gets
    REPLICA IDENTITY FULL: deletes, key updates (DELETE + INSERT pairs) and moves to another
    partition (a DELETE and an INSERT) need no more, so they flow."""
    topo = snapshotted_events(env, spark)
    env.run(
        env.pub,
        """
        CREATE TABLE events_2024_04 PARTITION OF events FOR VALUES FROM ('2024-04-01') TO ('2024-05-01');
        INSERT INTO events VALUES ('2024-04-02', 9000, 'new', 1), ('2024-04-03', 9001, 'new', 2),
                                  ('2024-04-04', 9003, 'new', 3);
        DELETE FROM events WHERE id = 9000;
        UPDATE events SET id = 9002 WHERE id = 9003;         -- a key update in the partition
        UPDATE events SET d = '2024-01-02' WHERE id = 9001;  -- a move to another partition
        DELETE FROM events WHERE id = 5;                     -- from a partition with full identity
        UPDATE events SET v = 'full' WHERE id = 6;
        """,
    )
    cycle(topo)
    assert_in_sync(topo)


def test_an_xcall_delete_from_a_partition_without_full_identity_is_refused(env, spark):
    """An XCALL delete passes the whole before image, which such a partition did not log."""
    topo = snapshotted_events(env, spark, {"del_cmd": "XCALL"})
    env.run(
        env.pub,
        "CREATE TABLE events_2024_04 PARTITION OF events FOR VALUES FROM ('2024-04-01') TO ('2024-05-01');"
        "INSERT INTO events VALUES ('2024-04-02', 9100, 'new', 1); DELETE FROM events WHERE id = 9100",
    )
    with pytest.raises(ReplError, match=r"the delete of a row of partitioned table public.events .*events_2024_04"):
        log_reader_agent.run_log_reader(topo, "p")
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.commands") == [(0,)]


def test_what_cannot_work_with_a_partitioned_table_is_refused_in_one_line(env):
    env.run(env.pub, EVENTS)
    cases = [
        (
            env.topology(["public.events", "public.events_2024_02"]),
            r"table public.events_2024_02 is published by article 'events_2024_02' and is also a partition of "
            r"public.events, whose article 'events' publishes the changes of its partitions as its own",
        ),
        (
            env.topology([{"table": "public.events", "include_children": True}]),
            r"public.events is a partitioned table, whose partitions are always published with it: remove "
            r"include_children",
        ),
    ]
    updatable = resolved_topology(
        {
            **env.servers(),
            "publications": [{"name": "p", "articles": ["public.events"], "allow_queued_tran": True}],
            "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
        }
    )
    cases.append(
        (
            updatable,
            r"article 'events' publishes the partitioned table public.events, and publication 'p' allows queued "
            r"updating \(allow_queued_tran\), which airflow-repl does not support for partitioned tables",
        )
    )
    for topo, message in cases:
        with pytest.raises(TopologyError, match=message):
            deploy.apply_topology(topo)
        assert env.rows(env.pub, "SELECT count(*) FROM pg_publication") == [(0,)]
        assert env.rows(
            env.pub, "SELECT DISTINCT relreplident FROM pg_class WHERE relname LIKE 'events%' AND relkind IN ('r', 'p')"
        ) == [("d",)]
        assert env.rows(
            env.pub, "SELECT count(*) FROM pg_attribute WHERE attname = 'msrepl_tran_version' AND attnum > 0"
        ) == [(0,)]


def test_a_subscriber_table_partitioned_its_own_way_is_kept(env, spark):
    """A subscriber that made its copy partitioned by hash of the id (the publisher partitions by
    month) keeps it through the snapshot and a reinitialization: emptied and loaded, with its
    partitions and keys; changes move rows between its partitions."""
    env.run(env.pub, EVENTS)
    env.run(
        env.sub,
        """
        CREATE TABLE events (d date NOT NULL, id int NOT NULL, v text, n int, PRIMARY KEY (d, id))
            PARTITION BY HASH (id);
        CREATE TABLE events_h0 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 0);
        CREATE TABLE events_h1 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 1);
        INSERT INTO events VALUES ('1999-01-01', 1, 'stale', 0);
        """,
    )
    topo = env.topology(["public.events"])
    partitions = "SELECT relname, (SELECT count(*) FROM events e WHERE e.tableoid = c.oid) FROM pg_class c "
    partitions += "WHERE relname LIKE 'events_h%' AND relkind = 'r' ORDER BY 1"
    for reinitialize in (False, True):
        snapshot_agent.run_snapshot(topo, "p", spark, reinitialize=reinitialize)
        assert env.rows(env.sub, "SELECT relkind FROM pg_class WHERE oid = 'events'::regclass") == [("p",)]
        counts = [n for _, n in env.rows(env.sub, partitions)]
        assert sum(counts) == 3000 and min(counts) > 1000
        assert rows(env.sub) == rows(env.pub)
    env.run(env.pub, "UPDATE events SET id = id + 10001 WHERE id % 10 = 0; DELETE FROM events WHERE id % 10 = 1")
    cycle(topo)
    assert rows(env.sub) == rows(env.pub)
    counts = [n for _, n in env.rows(env.sub, partitions)]
    assert sum(counts) == 2400 and min(counts) > 1000  # the moved rows' new ids end in 1 too
    assert_in_sync(topo)


def test_a_busy_new_partition_keeps_its_identity_until_a_later_log_reader_run(env, spark, caplog):
    """The Log Reader waits a moment for a new partition's lock, then reads anyway (inserts need
    no before image) and leaves the partition for its next run."""
    topo = snapshotted_events(env, spark)
    env.run(
        env.pub,
        "CREATE TABLE events_2024_04 PARTITION OF events FOR VALUES FROM ('2024-04-01') TO ('2024-05-01');"
        "INSERT INTO events VALUES ('2024-04-02', 9000, 'new', 1)",
    )
    identity = "SELECT relreplident FROM pg_class WHERE relname = 'events_2024_04'"
    with psycopg.connect(env.pub) as holder:
        holder.execute("SELECT count(*) FROM events_2024_04")  # its lock, held by an open transaction
        read = log_reader_agent.run_log_reader(topo, "p")
        assert read["transactions"] == 1 and env.rows(env.pub, identity) == [("d",)]
        assert "partition public.events_2024_04 of public.events (article 'events') keeps its replica identity" in (
            caplog.text
        )
    cycle(topo)
    assert env.rows(env.pub, identity) == [("f",)]
    env.run(env.pub, "UPDATE events SET v = 'later' WHERE id = 9000")
    cycle(topo)
    assert_in_sync(topo)


def test_a_publication_made_before_gets_publish_via_partition_root_when_applied(env):
    """A publication an earlier airflow-repl made (without the option) takes a partitioned
    table, with a row filter, when the topology is applied again."""
    env.run(env.pub, EVENTS + "CREATE TABLE other (id int PRIMARY KEY);")
    deploy.apply_topology(env.topology(["public.other"]))
    env.run(env.pub, "ALTER PUBLICATION airflow_repl_p SET (publish_via_partition_root = false)")
    deploy.apply_topology(env.topology(["public.other", {"table": "public.events", "row_filter": "n > 1"}]))
    assert env.rows(env.pub, "SELECT pubviaroot FROM pg_publication WHERE pubname = 'airflow_repl_p'") == [(True,)]
    assert env.rows(
        env.pub, "SELECT tablename, rowfilter FROM pg_publication_tables WHERE pubname = 'airflow_repl_p' ORDER BY 1"
    ) == [("events", "(n > 1)"), ("other", None)]
