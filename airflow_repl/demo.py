"""``make demo``: the whole product on the embedded default.

Starts the private PostgreSQL sandbox, creates a shop database with a live workload, and runs
the example DAGs through Airflow (``dag.test()``), whose operators spark-submit the agents in
Spark local mode: initial sync while the workload writes, scheduled replication cycles while it
keeps writing (a tracer token before each), a schema change (``airflow_repl_schema_change``: a
column added while the workload writes before and after it), then a last cycle once it stops.  Ends with per-article row counts and checksums
at the publisher and the subscriber (the new column included), the tracer tokens' latency per
hop, the measured throughput, queued updating subscriptions
(:mod:`airflow_repl.demo_updatable`): a subscriber's change reaching the publisher and the other
subscriber, and one conflict; and the demo publication at a MariaDB subscriber beside the
PostgreSQL one (:mod:`airflow_repl.demo_mariadb`), its row counts and checksums.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from airflow_repl import demo_mariadb, demo_updatable
from airflow_repl.engine.errors import ReplError

REPO = Path(__file__).resolve().parent.parent
DAGS = Path(os.environ.get("AIRFLOW_REPL_DAGS", REPO / "dags"))


def _say(msg: str) -> None:
    print(f"\n=== {msg}", flush=True)


#: The demo's databases on the sandbox: role -> (cluster, database).  The example topologies
#: (dags/demo_topology.yaml, dags/demo_updatable_topology.yaml) name them by the connection ids
#: ``repl_<role>`` (:data:`CONNECTION_IDS`).
DATABASES = {
    "publisher": ("publisher", "shop"),
    "distributor": ("publisher", "distribution"),
    "subscriber": ("subscriber", "shop_copy"),
    **{b: ("subscriber", f"shop_{b}") for b in demo_updatable.BRANCHES},
}
CONNECTION_IDS = {role: f"repl_{role}" for role in DATABASES}


def sandbox_conninfos(sandbox: Any, *, create: bool = False) -> dict[str, str]:
    """The connection strings of the demo's databases on ``sandbox``; ``create``: (re)create them
    empty first (their replication slots dropped)."""
    if create:
        return {role: sandbox.create_database(c, db, recreate=True) for role, (c, db) in DATABASES.items()}
    return {role: sandbox.conninfo(c, db) for role, (c, db) in DATABASES.items()}


def connection_environment(root: Path, conninfos: dict[str, str], airflow_home: Path | None = None) -> dict[str, str]:
    """What the example topologies and DAGs need in the environment: the Airflow home, the
    connections of the demo's databases (``AIRFLOW_CONN_REPL_*``, URIs with the password) and of
    Spark (local mode), and the snapshot folder."""
    from airflow_repl.engine.postgres.connections import to_uri

    return {
        "AIRFLOW_HOME": str(airflow_home or root / "airflow"),
        **{f"AIRFLOW_CONN_{CONNECTION_IDS[role].upper()}": to_uri(ci) for role, ci in conninfos.items()},
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_REPL_SNAPSHOT_FOLDER": str(root / "snapshots"),
    }


def prepare_environment(root: Path, conninfos: dict[str, str], airflow_home: Path | None = None) -> None:
    """Airflow home, connections and Spark settings for running the example DAGs."""
    from airflow_repl.engine.postgres.addresses import table_address

    env = connection_environment(root, conninfos, airflow_home)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    os.environ.update(
        {
            **env,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            # the table the asset-scheduled example DAG waits for (repl_on_replicated_table.py)
            "AIRFLOW_REPL_ORDERS_ASSET": table_address(conninfos["subscriber"], "public.orders").uri,
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
    # dag.test() runs the DAGs without a DAG processor, so the assets of their outlets are never
    # registered: each asset event would print two warnings (asset "not found", "inactive") per table
    os.environ.setdefault("AIRFLOW__LOGGING__NAMESPACE_LEVELS", "airflow.assets.manager=ERROR")
    # dag.test() parses every DAG file of the folder first; on a loaded machine importing one
    # (Airflow, the Spark provider, this package) can take longer than Airflow's 30 s default
    os.environ.setdefault("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT", "300")
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    if str(DAGS) not in sys.path:
        sys.path.insert(0, str(DAGS))


def migrate_airflow_db() -> None:
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def load_dag(filename: str) -> Any:
    spec = importlib.util.spec_from_file_location(filename[:-3], DAGS / filename)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the DAG file {DAGS / filename}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def run_dag(dag: Any, logical_date: datetime | None = None, run_conf: dict[str, Any] | None = None) -> str:
    kwargs: dict[str, Any] = {"run_conf": run_conf} if run_conf else {}
    dr = dag.test(logical_date=logical_date, **kwargs) if logical_date else dag.test(**kwargs)
    state = str(getattr(dr.state, "value", dr.state))
    if state != "success":
        raise SystemExit(f"DAG {dag.dag_id} ended in state {state!r}")
    return state


def current_interval_start(now: datetime, minutes: int = 10) -> datetime:
    """A 10-minute cron boundary at least one whole interval after ``now``.

    A manual run with it as logical date has a data interval ending there, and the Distribution
    Agent's ``until`` is that end: it must lie after every commit the run makes, including those
    of its own tasks (the Queue Reader's at the publisher), however close ``now`` is to a boundary.
    """
    floor = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % minutes)
    return floor + timedelta(minutes=2 * minutes)


def throughput(dist_conninfo: str) -> dict[str, float]:
    import psycopg

    from airflow_repl.engine.postgres import raw_sql

    with psycopg.connect(dist_conninfo) as conn:
        snap = raw_sql.one_row(
            conn.execute(
                "SELECT sum(rows_copied), sum((details->>'read_seconds')::float) FROM airflow_repl.agent_history "
                "WHERE agent = 'snapshot' AND status = 'succeeded' AND rows_copied > 0"
            )
        )
        dist = raw_sql.one_row(
            conn.execute(
                "SELECT sum(commands), sum((details->>'seconds')::float) FROM airflow_repl.agent_history "
                "WHERE agent = 'distribution' AND status = 'succeeded'"
            )
        )
        lr = raw_sql.one_row(
            conn.execute(
                "SELECT sum(commands), sum((details->>'seconds')::float) FROM airflow_repl.agent_history "
                "WHERE agent = 'logreader' AND status = 'succeeded'"
            )
        )
    rate = lambda n, s: round(float(n or 0) / float(s), 1) if s else 0.0  # noqa: E731
    return {
        "rows_snapshotted": int(snap[0] or 0),
        "snapshot_rows_per_s": rate(*snap),
        "commands_read": int(lr[0] or 0),
        "log_reader_commands_per_s": rate(*lr),
        "commands_delivered": int(dist[0] or 0),
        "delivered_commands_per_s": rate(*dist),
    }


def _start(root: Path) -> dict[str, str]:
    """The sandbox started with the demo's three databases (the shop's created); their conninfos."""
    from airflow_repl import demo_workload
    from airflow_repl.sandbox import Sandbox

    _say(f"starting the PostgreSQL sandbox in {root}")
    sb = Sandbox(root)
    sb.start()
    conninfos = sandbox_conninfos(sb, create=True)
    demo_workload.create(conninfos["publisher"])
    prepare_environment(root, conninfos)
    # the DAGs' topology, a copy the demo changes (an article added after the first cycle)
    topology = root / "demo_topology.yaml"
    topology.write_text((DAGS / "demo_topology.yaml").read_text())
    os.environ["AIRFLOW_REPL_TOPOLOGY"] = str(topology)
    _say("migrating the Airflow metadata database")
    migrate_airflow_db()
    return conninfos


def init_demo(root: Path) -> dict[str, Any]:
    """``airflow-repl sandbox init-demo``: the sandbox started, the demo's databases made again
    (empty), the shop's schema and seed rows and the notes of the updatable part at the
    publisher; nothing deployed, no DAG run.  Returns what it made (no password)."""
    import psycopg
    from psycopg import sql

    from airflow_repl import demo_workload
    from airflow_repl.engine.postgres import raw_sql
    from airflow_repl.engine.postgres.connections import describe
    from airflow_repl.sandbox import Sandbox

    sb = Sandbox(root)
    sb.start()
    conninfos = sandbox_conninfos(sb, create=True)
    demo_workload.create(conninfos["publisher"])
    demo_updatable.create_notes(conninfos["publisher"])
    with psycopg.connect(conninfos["publisher"]) as conn:
        tables = ("customers", "products", "orders", "order_lines", "store_notes")
        rows = {
            t: raw_sql.one_row(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))))[0]
            for t in tables
        }
    return {
        "sandbox": str(sb.root),
        "databases": {CONNECTION_IDS[role]: describe(ci) for role, ci in conninfos.items()},
        "publisher_rows": rows,
        "next": f'eval "$(airflow-repl sandbox env --root {sb.root})"',
    }


def sandbox_environment(root: Path) -> dict[str, str]:
    """``airflow-repl sandbox env``: :func:`connection_environment` of the sandbox in ``root``
    (the password read from its 0600 state file), and ``PGSERVICEFILE``: a 0600 libpq service
    file, written there, with a service per connection id (``psql service=repl_publisher``), so
    that psql needs no password on its command line."""
    from psycopg.conninfo import conninfo_to_dict

    from airflow_repl.sandbox import Sandbox

    sb = Sandbox(root)
    if not sb.state_file.exists():
        raise ReplError(
            f"no sandbox in {sb.root}: start one with 'airflow-repl sandbox init-demo' (the demo's databases) "
            f"or 'airflow-repl sandbox start'"
        )
    conninfos = sandbox_conninfos(sb)
    services = sb.root / "pg_service.conf"
    lines = []
    for role, conninfo in conninfos.items():
        params = conninfo_to_dict(conninfo)
        lines += [
            f"[{CONNECTION_IDS[role]}]",
            *(f"{k}={params[k]}" for k in ("host", "port", "user", "password", "dbname")),
            "",
        ]
    fd = os.open(services, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines))
    os.chmod(services, 0o600)
    return {**connection_environment(sb.root, conninfos), "PGSERVICEFILE": str(services)}


#: The schema change the demo makes while the workload writes (see dags/repl_schema_change.py).
SCHEMA_CHANGE = "ALTER TABLE public.orders ADD COLUMN channel text NOT NULL DEFAULT 'web'"


def _topology() -> Any:
    from airflow_repl.hooks.connections import load_topology  # connection ids: Airflow's lookup

    return load_topology(os.environ.get("AIRFLOW_REPL_TOPOLOGY", DAGS / "demo_topology.yaml"))


def _post_token() -> None:
    """A tracer token before each cycle: the latency of every hop is measured as it travels."""
    from airflow_repl.engine.monitoring import tracer

    tracer.post_tracer_token(_topology(), "shop")


#: The table the demo adds to the live publication after its first cycle, and its rows.
NEW_ARTICLE, NEW_ARTICLE_ROWS = "public.stores", 2000


def _add_article(publisher: str, initial: Any) -> None:
    """Add ``NEW_ARTICLE`` to the running publication: plan, apply, then the initial-sync DAG,
    whose snapshot copies that article alone while the workload keeps writing the others."""
    import psycopg

    from airflow_repl.engine.provisioning import plan

    _say(f"adding article {NEW_ARTICLE} to the live publication 'shop': plan, then apply")
    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {NEW_ARTICLE} (id int PRIMARY KEY, city text NOT NULL, opened date)")
        conn.execute(
            f"INSERT INTO {NEW_ARTICLE} SELECT g, 'city ' || g, date '2020-01-01' + g FROM generate_series(1, %s) g",
            (NEW_ARTICLE_ROWS,),
        )
    path = Path(os.environ["AIRFLOW_REPL_TOPOLOGY"])
    articles = "    articles:\n"
    path.write_text(path.read_text().replace(articles, f"{articles}      - table: {NEW_ARTICLE}\n", 1))
    print(plan.plan(_topology(), ["shop"]).format_table(), flush=True)
    plan.apply(_topology(), ["shop"])
    with psycopg.connect(publisher, autocommit=True) as conn:  # changed before its copy: in it, applied once
        conn.execute(f"UPDATE {NEW_ARTICLE} SET city = city || ' (moved)' WHERE id <= 100")
    _say("DAG airflow_repl_initial_sync: its snapshot copies only the new article, the others keep flowing")
    run_dag(initial)
    print(_last_snapshot(), flush=True)


def _last_snapshot() -> str:
    """What the last Snapshot Agent run copied, from its history row."""
    import psycopg

    with psycopg.connect(os.environ["AIRFLOW_CONN_REPL_DISTRIBUTOR"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT rows_copied, details->'tables', message FROM airflow_repl.agent_history "
            "WHERE agent = 'snapshot' ORDER BY run_id DESC LIMIT 1"
        ).fetchone()
    if row is None:
        return "  no snapshot run recorded"
    rows, tables, message = row
    return f"  the snapshot copied {rows} rows: {json.dumps(tables)}\n  {message}"


def _replicate(publisher: str, cycles: int) -> tuple[int, list[str]]:
    """The example DAGs while the workload writes: initial sync, scheduled cycles, then the
    schema-change DAG (a column added between the workload's writes before and after it), an
    article added after the first cycle (copied alone by the next snapshot); then
    rows using the new column and a last cycle once the workload stopped.  Returns (transactions
    committed, workload errors)."""
    from airflow_repl import demo_workload

    initial = load_dag("repl_initial_sync.py")
    scheduled = load_dag("repl_scheduled.py")
    schema = load_dag("repl_schema_change.py")
    workload = demo_workload.Workload(publisher).start()
    try:
        _say("DAG airflow_repl_initial_sync (snapshot -> log reader -> distribution) while the workload writes")
        run_dag(initial)
        for cycle in range(1, cycles + 1):
            _say(f"DAG airflow_repl_scheduled, cycle {cycle}, while the workload writes")
            _post_token()
            start = current_interval_start(datetime.now(timezone.utc)) + timedelta(minutes=10 * cycle)
            run_dag(scheduled, start, run_conf={"validate_every": 0})  # changes in flight: no validation
            if cycle == 1:
                _add_article(publisher, initial)
        _say(f"DAG airflow_repl_schema_change while the workload writes: {SCHEMA_CHANGE}")
        run_dag(schema, run_conf={"sql": SCHEMA_CHANGE})
    finally:
        committed = workload.stop()
    _say(f"workload stopped after {committed} transactions; rows use the new column; final replication cycle")
    _use_new_column(publisher)
    _post_token()
    start = current_interval_start(datetime.now(timezone.utc)) + timedelta(minutes=10 * (cycles + 1))
    run_dag(scheduled, start, run_conf={"validate_every": 1})  # quiet now: the DAG's validation task runs
    return committed, workload.errors


def _use_new_column(publisher: str) -> None:
    import psycopg

    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute("UPDATE orders SET channel = 'app' WHERE id % 5 = 0")


def _tracer_latency() -> dict[str, Any]:
    """Median and worst latency per hop of the demo's tracer tokens, printed."""
    from airflow_repl.engine.monitoring import tracer

    summary = tracer.latency_summary(tracer.tracer_history(_topology(), "shop"))
    _say("tracer token latency (seconds; the schedule's waits between cycles included)")
    for hop, figures in summary.items():
        print(
            f"  {hop:<28} median {figures['median']:>8.3f}  worst {figures['worst']:>8.3f}  ({figures['tokens']} tokens)"
        )
    return summary


def _validate() -> list[dict[str, Any]]:
    """Publisher vs subscriber, per article, printed."""
    from airflow_repl.engine.subscriber import validation

    report = validation.compare(_topology(), "shop", "reporting")
    _say("publisher vs subscriber")
    print(validation.format_report(report))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="airflow-repl demo")
    parser.add_argument("--root", default=".sandbox")
    parser.add_argument("--cycles", type=int, default=2, help="replication cycles while the workload runs")
    args = parser.parse_args(argv)
    started = time.monotonic()
    conninfos = _start(Path(args.root).resolve())
    committed, errors = _replicate(conninfos["publisher"], args.cycles)
    report = _validate()
    _tracer_latency()
    stats = throughput(conninfos["distributor"])
    _say("throughput (agent time, excluding spark-submit start-up)")
    for k, v in stats.items():
        print(f"  {k:<28} {v}")
    print(f"  {'workload_transactions':<28} {committed}")
    print(f"  {'demo_seconds':<28} {time.monotonic() - started:.0f}")
    if errors:
        print(f"workload errors: {errors[:3]}", file=sys.stderr)
    updatable_ok = demo_updatable.run(sys.modules[__name__], conninfos)
    mariadb_ok = demo_mariadb.run(sys.modules[__name__], conninfos, Path(args.root).resolve())
    ok = all(r["match"] for r in report) and updatable_ok and mariadb_ok
    print("\nRESULT:", "every article matches" if ok else "MISMATCH", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
