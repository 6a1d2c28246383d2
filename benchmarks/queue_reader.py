"""Queue Reader Agent throughput (``make bench``): queued transactions applied at the publisher
per second.

Starts a private sandbox, publishes one table with queued updating, snapshots it to one queued
subscriber, then, for several rounds, commits N single-row UPDATE transactions at the subscriber
(each queued by its trigger) and times one Queue Reader run that applies them all at the
publisher (no conflicts: the publisher does not change the rows meanwhile).  Prints each round's
rate and the median; checks that the publisher ends equal to the subscriber.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import psycopg

from airflow_repl.engine.agents import queue_reader_agent, snapshot_agent
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
from airflow_repl.jobs.session import spark_session
from airflow_repl.sandbox import Sandbox


def queue_updates(conninfo: str, rows: int, transactions: int, round_: int) -> None:
    """``transactions`` single-row updates at the subscriber, each its own transaction."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for i in range(transactions):
            conn.execute("UPDATE qt SET v = v + 1, note = %s WHERE id = %s", (f"round {round_}", i % rows + 1))


def table(conninfo: str) -> list[tuple]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute("SELECT id, v, note, msrepl_tran_version::text FROM qt ORDER BY id").fetchall()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="airflow-repl-bench-queue-")
    sb = Sandbox(root)
    sb.start()
    spark = spark_session("airflow-repl-bench-queue")
    spark.sparkContext.setLogLevel("ERROR")
    rates: list[float] = []
    try:
        pub = sb.create_database("publisher", "bench_queue_pub", recreate=True)
        dist = sb.create_database("publisher", "bench_queue_dist", recreate=True)
        sub = sb.create_database("subscriber", "bench_queue_sub", recreate=True)
        with psycopg.connect(pub, autocommit=True) as conn:
            conn.execute("CREATE TABLE qt (id int PRIMARY KEY, v int NOT NULL, note text)")
            conn.execute("INSERT INTO qt SELECT g, 0, NULL FROM generate_series(1, %s) g", (args.rows,))
        topo = resolve_topology(
            topology.from_dict(
                {
                    "publisher": to_uri(pub),
                    "distributor": to_uri(dist),
                    "subscribers": {"branch": to_uri(sub)},
                    "snapshot_folder": f"{root}/snapshots",
                    "publications": [{"name": "bench", "articles": ["public.qt"], "allow_queued_tran": True}],
                    "subscriptions": [{"publication": "bench", "subscriber": "branch", "update_mode": "queued tran"}],
                }
            )
        )
        snapshot_agent.run_snapshot(topo, "bench", spark)
        for r in range(args.rounds):
            queue_updates(sub, args.rows, args.transactions, r)
            t0 = time.monotonic()
            result = queue_reader_agent.run_queue_reader(topo, "bench", "branch")
            seconds = time.monotonic() - t0
            rates.append(result["transactions"] / seconds)
            print(
                f"round {r + 1}: {result['transactions']} queued transactions applied in {seconds:.2f}s: "
                f"{rates[-1]:.0f} per second ({result['conflicts']} conflicts, {result['queued']} left)",
                flush=True,
            )
        in_sync = table(pub) == table(sub)
    finally:
        spark.stop()
        sb.destroy()
    summary = {
        "transactions_per_round": args.transactions,
        "rates": [round(r) for r in rates],
        "median_transactions_per_second": round(statistics.median(rates)),
        "in_sync": in_sync,
    }
    print(json.dumps(summary, indent=2))
    return 0 if in_sync else 1


if __name__ == "__main__":
    sys.exit(main())
