"""Delivery throughput per propagation method on one workload (``make bench``).

Starts a private sandbox, and for each method (generated procedures with CALL, SCALL, XCALL
update syntax, and SQL statements) snapshots the same table, runs the same mixed workload at the
publisher (updates of non-key columns, inserts, deletes, key updates), reads it with the Log
Reader Agent and times the Distribution Agent.  Prints changes delivered per second.
"""

from __future__ import annotations

import argparse
import json
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

METHODS = {
    "CALL": {"upd_cmd": "CALL"},
    "SCALL": {"upd_cmd": "SCALL"},
    "XCALL": {"upd_cmd": "XCALL", "del_cmd": "XCALL"},
    "SQL": {"ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"},
}


def workload(conninfo: str, rows: int, transactions: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for t in range(transactions):
            with conn.transaction():
                lo = 1 + (t * 97) % (rows - 100)
                conn.execute(
                    "UPDATE bench SET qty = qty + 1, note = 'u' || %s WHERE id BETWEEN %s AND %s", (t, lo, lo + 39)
                )
                conn.execute(
                    "INSERT INTO bench (id, qty, price, note) SELECT g, 1, 9.5, 'new' FROM generate_series(%s, %s) g",
                    (10_000_000 + t * 10, 10_000_000 + t * 10 + 4),
                )
                conn.execute("DELETE FROM bench WHERE id IN (%s, %s)", (lo + 50, lo + 51))
                conn.execute("UPDATE bench SET id = id + 20000000 WHERE id = %s", (lo + 60,))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--transactions", type=int, default=400)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="airflow-repl-bench-")
    sb = Sandbox(root)
    sb.start()
    spark = spark_session("airflow-repl-bench")
    spark.sparkContext.setLogLevel("ERROR")
    results = {}
    try:
        for method, options in METHODS.items():
            name = method.lower()
            pub = sb.create_database("publisher", f"bench_pub_{name}", recreate=True)
            dist = sb.create_database("publisher", f"bench_dist_{name}", recreate=True)
            sub = sb.create_database("subscriber", f"bench_sub_{name}", recreate=True)
            with psycopg.connect(pub, autocommit=True) as conn:
                conn.execute(
                    "CREATE TABLE bench (id bigint PRIMARY KEY, qty int, price numeric(10,2), note text, "
                    "at timestamptz DEFAULT now())"
                )
                conn.execute(
                    "INSERT INTO bench (id, qty, price, note) SELECT g, g %% 7, g * 0.5, md5(g::text) "
                    "FROM generate_series(1, %s) g",
                    (args.rows,),
                )
            topo = resolve_topology(
                topology.from_dict(
                    {
                        "publisher": to_uri(pub),
                        "distributor": to_uri(dist),
                        "subscribers": {"s": to_uri(sub)},
                        "snapshot_folder": f"{root}/snapshots",
                        "publications": [{"name": "bench", "articles": [{"table": "bench", **options}]}],
                        "subscriptions": [
                            {
                                "publication": "bench",
                                "subscriber": "s",
                                "commit_batch_size": 50,
                                "commit_batch_threshold": 5000,
                            }
                        ],
                    }
                )
            )
            snap = snapshot_agent.run_snapshot(topo, "bench", spark)
            workload(pub, args.rows, args.transactions)
            read = log_reader_agent.run_log_reader(topo, "bench")
            t0 = time.monotonic()
            delivered = distribution_agent.run_distribution(topo, "bench", "s")
            seconds = time.monotonic() - t0
            ok = all(r["match"] for r in validation.compare(topo, "bench", "s"))
            results[method] = {
                "commands": delivered["commands"],
                "seconds": round(seconds, 2),
                "changes_per_s": round(delivered["commands"] / seconds),
                "log_reader_per_s": round(read["commands"] / read["seconds"]),
                "snapshot_rows_per_s": snap["rows_per_second"],
                "in_sync": ok,
            }
            print(
                f"{method:<6} {delivered['commands']:>7} changes in {seconds:6.2f}s = "
                f"{results[method]['changes_per_s']:>6} changes/s  (log reader "
                f"{results[method]['log_reader_per_s']}/s, in sync: {ok})",
                flush=True,
            )
    finally:
        spark.stop()
        sb.destroy()
    print(json.dumps(results, indent=2))
    return 0 if all(r["in_sync"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
