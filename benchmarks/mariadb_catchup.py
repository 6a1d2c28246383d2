"""Catch-up of a pgbench backlog to a MariaDB subscriber beside the same to a PostgreSQL
subscriber, in one run (``make bench``; docs/performance.md, docs/subscribers-mariadb.md).

Starts a private sandbox (publisher and subscriber PostgreSQL clusters and a MariaDB server),
initializes pgbench's tables at the publisher (``pgbench_history`` given a key), publishes the
four tables to subscriber ``pg`` (PostgreSQL, generated procedures: the default) and ``maria``
(MariaDB, SQL statements: its default), snapshots both, writes ``--transactions`` pgbench
transactions (two clients), reads them once with the Log Reader Agent and times the Distribution
Agent of each subscriber on the same backlog.  Prints the seconds and commands per second of
each, the ratio MariaDB / PostgreSQL (target: at most ``--target``), and each table's row count
and checksum at both subscribers; exits 1 when they differ.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from decimal import Decimal

import psycopg
from psycopg.conninfo import conninfo_to_dict

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
from airflow_repl.jobs.session import spark_session
from airflow_repl.sandbox import Sandbox

#: pgbench's tables and their keys (pgbench_history gets one).
TABLES = {"pgbench_accounts": "aid", "pgbench_branches": "bid", "pgbench_tellers": "tid", "pgbench_history": "id"}


def pgbench(sb: Sandbox, conninfo: str, *args: str) -> str:
    """Run pgbench against ``conninfo`` (its password in the environment, not on the command line)."""
    p = conninfo_to_dict(conninfo)
    env = {
        **os.environ,
        "PGHOST": str(p["host"]),
        "PGPORT": str(p["port"]),
        "PGUSER": str(p["user"]),
        "PGPASSWORD": str(p["password"]),
        "PGDATABASE": str(p["dbname"]),
    }
    res = subprocess.run([str(sb.bindir / "pgbench"), *args], env=env, capture_output=True, text=True, cwd="/")
    if res.returncode != 0:
        raise SystemExit(f"pgbench {' '.join(args)} failed: {res.stderr.strip()[-2000:]}")
    return res.stdout


def pg_table(conninfo: str, table: str, key: str) -> tuple[int, str]:
    """Row count and a checksum of (key, the balance or delta column) at a PostgreSQL database."""
    value = "delta" if table == "pgbench_history" else table.removeprefix("pgbench_")[0] + "balance"
    with psycopg.connect(conninfo) as conn:
        count, total = conn.execute(
            f"SELECT count(*), coalesce(sum({key}::numeric * 7 + {value}), 0) FROM public.{table}"
        ).fetchone()
    return int(count), str(Decimal(total))


def maria_table(server, database: str, table: str, key: str) -> tuple[int, str]:
    value = "delta" if table == "pgbench_history" else table.removeprefix("pgbench_")[0] + "balance"
    with server.connection(database) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*), COALESCE(SUM(CAST({key} AS DECIMAL(30)) * 7 + {value}), 0) FROM `{table}`")
        count, total = cur.fetchone()
    return int(count), str(Decimal(total))


def report(args, read, load, log_reader, seconds, commands, servers) -> bool:
    """Print the figures and each table's rows and checksum; whether all three databases agree."""
    pub, sub, maria, maria_db = servers
    ratio = seconds["maria"] / seconds["pg"]
    transactions = 2 * max(1, args.transactions // 2)
    print(f"catch-up of {transactions:,} pgbench transactions ({read.get('commands', 0):,} row changes)")
    print(f"  pgbench at the publisher: {load:.1f} s")
    print(f"  log reader (shared):      {log_reader:.1f} s")
    for name, label in (("pg", "PostgreSQL subscriber"), ("maria", "MariaDB subscriber")):
        rate = commands[name] / seconds[name] if seconds[name] else 0.0
        print(f"  distribution, {label:22s} {seconds[name]:7.1f} s  {commands[name]:,} commands  {rate:,.0f}/s")
    verdict = "within" if ratio <= args.target else "ABOVE"
    print(f"  ratio MariaDB / PostgreSQL: {ratio:.2f}x ({verdict} the {args.target}x target)")
    same = True
    for table, key in TABLES.items():
        at_pg, at_maria, at_pub = (
            pg_table(sub, table, key),
            maria_table(maria, maria_db, table, key),
            pg_table(pub, table, key),
        )
        same &= at_pg == at_maria == at_pub
        print(f"  {table:18s} rows/checksum publisher {at_pub}  pg {at_pg}  maria {at_maria}")
    print(
        json.dumps(
            {
                "transactions": transactions,
                "commands": commands,
                "seconds": {k: round(v, 2) for k, v in seconds.items()},
                "log_reader_seconds": round(log_reader, 2),
                "ratio": round(ratio, 3),
                "target": args.target,
                "identical": same,
            }
        )
    )
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=100_000, help="pgbench transactions (default 100,000)")
    parser.add_argument("--scale", type=int, default=1, help="pgbench scale (default 1: 100,000 accounts)")
    parser.add_argument("--target", type=float, default=1.5, help="the ratio MariaDB / PostgreSQL aimed at")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="airflow-repl-bench-mariadb-")
    sb = Sandbox(root)
    sb.start()
    maria = sb.mariadb()
    maria.start()
    spark = spark_session("airflow-repl-bench-mariadb")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        pub = sb.create_database("publisher", "bench_pub", recreate=True)
        dist = sb.create_database("publisher", "bench_dist", recreate=True)
        sub = sb.create_database("subscriber", "bench_sub", recreate=True)
        maria_db = "bench_maria"
        maria.create_database(maria_db, recreate=True)
        pgbench(sb, pub, "-i", "-q", "-s", str(args.scale))
        with psycopg.connect(pub, autocommit=True) as conn:
            conn.execute("ALTER TABLE public.pgbench_history ADD COLUMN id bigserial PRIMARY KEY")
        topo = resolve_topology(
            topology.from_dict(
                {
                    "publisher": to_uri(pub),
                    "distributor": to_uri(dist),
                    "subscribers": {"pg": to_uri(sub), "maria": maria.uri(maria_db)},
                    "snapshot_folder": f"{root}/snapshots",
                    "publications": [{"name": "bench", "articles": [f"public.{t}" for t in TABLES]}],
                    "subscriptions": [
                        {
                            "publication": "bench",
                            "subscriber": s,
                            "commit_batch_size": 1000,
                            "commit_batch_threshold": 10000,
                        }
                        for s in ("pg", "maria")
                    ],
                }
            )
        )
        snapshot_agent.run_snapshot(topo, "bench", spark)
        log_reader_agent.run_log_reader(topo, "bench")
        t0 = time.monotonic()
        pgbench(sb, pub, "-n", "-c", "2", "-j", "2", "-t", str(max(1, args.transactions // 2)))
        load = time.monotonic() - t0
        t0 = time.monotonic()
        read = log_reader_agent.run_log_reader(topo, "bench")
        log_reader = time.monotonic() - t0
        seconds, commands = {}, {}
        for name in ("pg", "maria"):
            t0 = time.monotonic()
            done = distribution_agent.run_distribution(topo, "bench", name)
            seconds[name] = time.monotonic() - t0
            commands[name] = done["commands"]
        same = report(args, read, load, log_reader, seconds, commands, (pub, sub, maria, maria_db))
        return 0 if same else 1
    finally:
        spark.stop()
        sb.destroy()


if __name__ == "__main__":
    sys.exit(main())
