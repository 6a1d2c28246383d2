"""One stream against three on the workload that used to make streams wait on each other
(``make bench``): key updates of a table that also has a unique column, each update a
DELETE + INSERT pair carrying the same unique value.

Starts a private sandbox, snapshots the table to two subscribers (one subscription with one
stream, one with three), runs the workload, reads it once with the Log Reader Agent, then times
the Distribution Agent to each subscriber, alternating which goes first, for several rounds.
Prints the seconds per round, the replays (batches retried on one stream: 0 expected), and the
median ratio three streams / one stream (machines are noisy: compare ratios, not times).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import psycopg

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
from airflow_repl.engine.subscriber import validation
from airflow_repl.jobs.session import spark_session
from airflow_repl.sandbox import Sandbox

SUBSCRIBERS = {"one": 1, "three": 3}


def key_updates(conninfo: str, rows: int, transactions: int, per_txn: int, round_: int) -> None:
    groups = rows // per_txn
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for i in range(transactions):
            conn.execute(
                "UPDATE kt SET id = id + %s, v = v + 1 WHERE id %% %s = %s",
                (rows * 10 * (round_ + 1), groups, i % groups),
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--transactions", type=int, default=20)
    parser.add_argument("--per-transaction", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="airflow-repl-bench-streams-")
    sb = Sandbox(root)
    sb.start()
    spark = spark_session("airflow-repl-bench-streams")
    spark.sparkContext.setLogLevel("ERROR")
    rounds: list[dict] = []
    try:
        pub = sb.create_database("publisher", "bench_streams_pub", recreate=True)
        dist = sb.create_database("publisher", "bench_streams_dist", recreate=True)
        subs = {name: sb.create_database("subscriber", f"bench_streams_{name}", recreate=True) for name in SUBSCRIBERS}
        with psycopg.connect(pub, autocommit=True) as conn:
            conn.execute("CREATE TABLE kt (id bigint PRIMARY KEY, code text NOT NULL UNIQUE, v int)")
            conn.execute("INSERT INTO kt SELECT g, 'c' || g, 0 FROM generate_series(1, %s) g", (args.rows,))
        topo = resolve_topology(
            topology.from_dict(
                {
                    "publisher": to_uri(pub),
                    "distributor": to_uri(dist),
                    "subscribers": {name: to_uri(ci) for name, ci in subs.items()},
                    "snapshot_folder": f"{root}/snapshots",
                    "publications": [{"name": "bench", "articles": ["public.kt"]}],
                    "subscriptions": [
                        {
                            "publication": "bench",
                            "subscriber": name,
                            "subscription_streams": n,
                            "commit_batch_size": 100,
                            "commit_batch_threshold": 1000,
                        }
                        for name, n in SUBSCRIBERS.items()
                    ],
                }
            )
        )
        snapshot_agent.run_snapshot(topo, "bench", spark)
        for r in range(args.rounds):
            key_updates(pub, args.rows, args.transactions, args.per_transaction, r)
            read = log_reader_agent.run_log_reader(topo, "bench")
            order = list(SUBSCRIBERS) if r % 2 == 0 else list(reversed(SUBSCRIBERS))
            result: dict = {"commands": read["commands"]}
            for name in order:
                t0 = time.monotonic()
                delivered = distribution_agent.run_distribution(topo, "bench", name)
                result[name] = {
                    "seconds": round(time.monotonic() - t0, 3),
                    "retries": delivered["retries"],
                    "parallel_batches": delivered.get("parallel_batches", 0),
                }
            result["ratio"] = round(result["three"]["seconds"] / result["one"]["seconds"], 3)
            rounds.append(result)
            print(
                f"round {r + 1}: {read['commands']} commands; 1 stream {result['one']['seconds']:.2f}s, "
                f"3 streams {result['three']['seconds']:.2f}s ({result['three']['parallel_batches']} batches "
                f"spread, {result['three']['retries']} replays); ratio {result['ratio']}",
                flush=True,
            )
        in_sync = all(r["match"] for name in SUBSCRIBERS for r in validation.compare(topo, "bench", name))
    finally:
        spark.stop()
        sb.destroy()
    summary = {
        "rounds": rounds,
        "median_ratio_3_to_1": statistics.median(r["ratio"] for r in rounds),
        "replays": sum(r["three"]["retries"] for r in rounds),
        "in_sync": in_sync,
    }
    print(json.dumps(summary, indent=2))
    return 0 if in_sync and summary["replays"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
