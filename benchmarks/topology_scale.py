"""Distribution cost against the number of subscriptions and the number of changes (``make bench``).

Starts a private sandbox, publishes one small table to ``--subscribers`` subscriptions (one
database each on the subscriber cluster), snapshots it once, then for each workload size in
``--changes`` (row changes, 10 per transaction) runs the Log Reader once and the Distribution
Agent to every subscriber one after the other, timing each delivery.  Prints, per size, the
cumulative delivery time after 1, 10, 25 ... subscribers and the time per change, and checks
that every subscriber ends equal to the publisher.  Linear cost shows as a constant time per
subscriber (cumulative time proportional to the count) and a time per change that does not grow
with the size.  See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import psycopg

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
from airflow_repl.engine.subscriber import validation
from airflow_repl.jobs.session import spark_session
from airflow_repl.sandbox import Sandbox

ROWS = 1_000
PER_TXN = 10


def build(sb: Sandbox, root: str, count: int) -> Any:
    pub = sb.create_database("publisher", "scale_pub", recreate=True)
    dist = sb.create_database("publisher", "scale_dist", recreate=True)
    subs = {
        f"s{i:02d}": to_uri(sb.create_database("subscriber", f"scale_sub_{i:02d}", recreate=True)) for i in range(count)
    }
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text)")
        conn.execute("INSERT INTO t SELECT g, 0, md5(g::text) FROM generate_series(1, %s) g", (ROWS,))
    spec = {
        "publisher": to_uri(pub),
        "distributor": to_uri(dist),
        "subscribers": subs,
        "snapshot_folder": f"{root}/snapshots",
        "publications": [{"name": "scale", "articles": [{"table": "t"}]}],
        "subscriptions": [{"publication": "scale", "subscriber": name} for name in subs],
    }
    return pub, resolve_topology(topology.from_dict(spec))


def workload(conninfo: str, changes: int, round_: int) -> None:
    """``changes`` row updates, ``PER_TXN`` per transaction."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for t in range(changes // PER_TXN):
            lo = 1 + (t * PER_TXN) % (ROWS - PER_TXN)
            conn.execute(
                "UPDATE t SET v = v + 1, note = %s WHERE id BETWEEN %s AND %s",
                (f"r{round_}t{t}", lo, lo + PER_TXN - 1),
            )


def deliver_all(topo: Any, names: list[str]) -> list[float]:
    seconds = []
    for name in names:
        t0 = time.monotonic()
        distribution_agent.run_distribution(topo, "scale", name)
        seconds.append(time.monotonic() - t0)
    return seconds


def checkpoints(count: int) -> list[int]:
    return sorted({k for k in (1, 10, 25, 50, 100, count) if k <= count})


def one_size(pub: str, topo: Any, names: list[str], changes: int, round_: int) -> dict[str, Any]:
    workload(pub, changes, round_)
    read = log_reader_agent.run_log_reader(topo, "scale")
    per_sub = deliver_all(topo, names)
    cumulative = {k: round(sum(per_sub[:k]), 2) for k in checkpoints(len(names))}
    median = statistics.median(per_sub)
    return {
        "changes": read["commands"],
        "log_reader_s": round(read["seconds"], 2),
        "median_per_subscriber_s": round(median, 3),
        "per_change_ms": round(1000 * median / max(1, read["commands"]), 4),
        "cumulative_s": cumulative,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscribers", type=int, default=50)
    parser.add_argument("--changes", type=int, nargs="+", default=[2_000, 4_000, 8_000])
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="airflow-repl-scale-")
    sb = Sandbox(root)
    sb.start()
    spark = spark_session("airflow-repl-bench-scale")
    spark.sparkContext.setLogLevel("ERROR")
    results: list[dict[str, Any]] = []
    in_sync = False
    try:
        pub, topo = build(sb, root, args.subscribers)
        names = sorted(topo.subscribers)
        t0 = time.monotonic()
        snapshot_agent.run_snapshot(topo, "scale", spark)
        print(f"snapshot to {len(names)} subscribers: {time.monotonic() - t0:.1f} s", flush=True)
        for round_, changes in enumerate(args.changes):
            res = one_size(pub, topo, names, changes, round_)
            results.append(res)
            print(
                f"{res['changes']:>6} changes: log reader {res['log_reader_s']} s, distribution "
                f"{res['median_per_subscriber_s']} s per subscriber (median; {res['per_change_ms']} ms per change); "
                f"cumulative after k subscribers: {res['cumulative_s']}",
                flush=True,
            )
        in_sync = all(r["match"] for name in names for r in validation.compare(topo, "scale", name))
    finally:
        spark.stop()
        sb.destroy()
    print(json.dumps({"subscribers": args.subscribers, "sizes": results, "in_sync": in_sync}, indent=2))
    return 0 if in_sync else 1


if __name__ == "__main__":
    sys.exit(main())
