"""Commit latency added by immediate updating at the subscriber.

Starts a private sandbox (publisher and subscriber in separate clusters on this machine),
snapshots one table to an immediate (``sync tran``) subscriber and to a read-only one, and times
``--updates`` single-row UPDATE transactions (statement + commit, measured by the application)
at each.  Prints the median and p95 in milliseconds for both and the difference: the latency
immediate updating adds (the change sent to the publisher through dblink, PREPARE TRANSACTION
there, the gid recorded), and, since each transaction's first change first commits the same
session's previous prepared transaction at the publisher (COMMIT PREPARED), that round trip
too.  No resolver runs meanwhile (it would only race the session for the same gids); the last
transaction's is committed by one resolver round at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import psycopg

from airflow_repl.engine.agents import snapshot_agent
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
from airflow_repl.engine.subscriber import in_doubt
from airflow_repl.jobs.session import spark_session
from airflow_repl.sandbox import Sandbox


def timed_updates(conninfo: str, updates: int, rows: int) -> list[float]:
    """Milliseconds per single-row UPDATE transaction (after a warm-up of 50)."""
    times: list[float] = []
    with psycopg.connect(conninfo) as conn:
        for i in range(updates + 50):
            start = time.perf_counter()
            conn.execute("UPDATE bench SET qty = qty + 1 WHERE id = %s", (1 + i % rows,))
            conn.commit()
            if i >= 50:
                times.append((time.perf_counter() - start) * 1000)
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
    }


def build(sb: Sandbox, rows: int, root: str) -> tuple[topology.Topology, str, str]:
    pub = sb.create_database("publisher", "lat_pub", recreate=True)
    dist = sb.create_database("publisher", "lat_dist", recreate=True)
    subs = {name: sb.create_database("subscriber", f"lat_{name}", recreate=True) for name in ("imm", "ro")}
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench (id bigint PRIMARY KEY, qty int NOT NULL, note text)")
        conn.execute("INSERT INTO bench SELECT g, 0, md5(g::text) FROM generate_series(1, %s) g", (rows,))
    topo = resolve_topology(
        topology.from_dict(
            {
                "publisher": to_uri(pub),
                "distributor": to_uri(dist),
                "subscribers": {name: to_uri(ci) for name, ci in subs.items()},
                "snapshot_folder": f"{root}/snapshots",
                "publications": [{"name": "lat", "articles": ["public.bench"], "allow_sync_tran": True}],
                "subscriptions": [
                    {"publication": "lat", "subscriber": "imm", "update_mode": "sync tran"},
                    {"publication": "lat", "subscriber": "ro", "update_mode": "read only"},
                ],
            }
        )
    )
    return topo, subs["imm"], subs["ro"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="airflow-repl-latency-")
    sb = Sandbox(root)
    sb.start()
    spark = spark_session("airflow-repl-latency")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        topo, immediate, read_only = build(sb, args.rows, root)
        snapshot_agent.run_snapshot(topo, "lat", spark)
        results = {
            "read only": summary(timed_updates(read_only, args.updates, args.rows)),
            "sync tran": summary(timed_updates(immediate, args.updates, args.rows)),
        }
        left = in_doubt.resolve_in_doubt(topo, "lat", "imm")
        results["added"] = {
            k: round(results["sync tran"][k] - results["read only"][k], 3) for k in ("median_ms", "p95_ms")
        }
        print(json.dumps({"updates": args.updates, **results, "left_for_the_last_round": left["imm"]}, indent=2))
    finally:
        spark.stop()
        sb.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
