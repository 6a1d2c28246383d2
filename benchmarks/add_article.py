"""Adding one article to a live publication, against a full reinitialize and against native's
``ALTER SUBSCRIPTION ... REFRESH PUBLICATION``, in one run (``make bench``).

Starts the sandbox of ``native_compare`` (publisher, subscriber, native clusters), publishes the
pgbench tables (``--scale`` N: N x 100,000 ``pgbench_accounts`` rows) to our subscriber and to a
native subscription, and initializes both.  Then a new table ``bench_stores`` of
``--article-rows`` rows is added to both publications:

- native: ``ALTER PUBLICATION ... ADD TABLE`` and ``ALTER SUBSCRIPTION ... REFRESH PUBLICATION``,
  timed from the refresh until the table is ready in ``pg_subscription_rel``;
- airflow-repl: ``airflow-repl apply`` with the article added, then ``airflow-repl snapshot``
  (a CLI subprocess, read tasks in threads), which copies that article alone; the snapshot run
  is timed (apply is the counterpart of ``ALTER PUBLICATION``, not timed on either side);
- then a full ``airflow-repl snapshot --reinitialize`` of every article, timed.

The copy alone is split into its floor: the process start (Python and the command's imports,
timed on their own, the quickest of three), the copy itself (``read_seconds``: COPY out, the Parquet file, COPY in),
the bookkeeping around it in the agent's run, and the rest of the process.

Every table's checksum must then match at the publisher, our subscriber and the native one.
Prints ``measure | native | airflow-repl | ratio`` and writes the same as JSON (``--json``).
See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import native_compare as nc  # the sandbox, setup and measuring helpers of make bench

TABLE = "bench_stores"
DEFAULT_JSON = "benchmarks/results/add_article.json"
#: what ``airflow-repl snapshot`` imports when it copies: timed alone, the process's start (the
#: modules of the data files are imported by the run when it has something to copy)
STARTUP = (
    "import airflow_repl.cli, airflow_repl.jobs.agent_job, airflow_repl.engine.agents.snapshot_agent; "
    "airflow_repl.engine.agents.snapshot_agent.snapshot_folder.import_file_modules()"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scale", type=int, default=10, help="pgbench -i scale of the publication (default 10)")
    parser.add_argument("--article-rows", type=int, default=100_000, help="rows of the added table (default 100000)")
    parser.add_argument("--json", default=DEFAULT_JSON, help=f"where to write the results (default {DEFAULT_JSON})")
    args = parser.parse_args(argv)
    if args.scale < 1 or args.article_rows < 1:
        parser.error("--scale and --article-rows must be at least 1")
    return args


def _native_ready(b: nc.Bench, tables: int) -> bool:
    waiting, total = nc.query_one(
        b.native, "SELECT count(*) FILTER (WHERE srsubstate <> 'r'), count(*) FROM pg_catalog.pg_subscription_rel"
    )
    return waiting == 0 and total == tables


def _create_table(b: nc.Bench, rows: int) -> None:
    ddl = f"CREATE TABLE public.{TABLE} (id bigint PRIMARY KEY, name text NOT NULL, city text, opened date)"
    nc.execute(b.pub, ddl)
    nc.execute(b.native, ddl)
    nc.execute(
        b.pub,
        f"INSERT INTO public.{TABLE} SELECT g, 'store ' || g, md5(g::text), date '2020-01-01' + g %% 1000 "
        "FROM generate_series(1, %s) g",
        (rows,),
    )


def _snapshot(b: nc.Bench, *extra: str) -> tuple[float, dict]:
    seconds, _, out = nc.run_measured(
        nc.cli("snapshot", "-t", str(b.topology_file), "-p", "bench", *extra), b.env, "airflow-repl snapshot"
    )
    return seconds, json.loads(out)


def _floor_rows(b: nc.Bench, native: float, added: float, own: float, copied: float, imported: float) -> float:
    """The rows of what copying the article alone is made of; returns the process start (the
    quickest of three: its floor, which a single run on a loaded machine overstates).  The run's
    import of the data files' modules (``imported``) is counted in the start, not the bookkeeping."""
    start = min(nc.run_measured([sys.executable, "-c", STARTUP], b.env, "the process start")[0] for _ in range(3))
    b.rows.append(nc.row("of which the process start: Python and the command's imports", None, start, "s", False))
    b.rows.append(nc.row("of which the copy itself: COPY out, Parquet file, COPY in", native, copied, "s"))
    b.rows.append(
        nc.row(
            "of which the bookkeeping: topology applied, checks, slot, keys, row check, hand-off, history",
            None,
            own - copied - imported,
            "s",
            False,
        )
    )
    b.rows.append(
        nc.row(
            "of which the rest: the topology file read, connections, exit",
            None,
            added - (own - imported) - start,
            "s",
            False,
        )
    )
    return start


def run(b: nc.Bench, args: argparse.Namespace) -> None:
    from psycopg import sql

    nc.setup(b, args.scale)
    conninfo = nc.native_conninfo(b)
    nc.execute(
        b.native,
        sql.SQL("CREATE SUBSCRIPTION native_sub CONNECTION {} PUBLICATION native_pub").format(sql.Literal(conninfo)),
    )
    nc.wait_for(lambda: _native_ready(b, len(nc.TABLES)), "native initial sync", 3600)
    _snapshot(b)
    print(f"initialized: {b.extra['accounts_rows']:,} accounts rows at both subscribers", flush=True)

    _create_table(b, args.article_rows)
    nc.execute(b.pub, f"ALTER PUBLICATION native_pub ADD TABLE public.{TABLE}")
    t0 = time.monotonic()
    nc.execute(b.native, "ALTER SUBSCRIPTION native_sub REFRESH PUBLICATION")
    native = nc.wait_for(lambda: _native_ready(b, len(nc.TABLES) + 1), "native refresh", 3600) - t0

    text = b.topology_file.read_text().replace("subscriptions:\n", f"      - table: public.{TABLE}\nsubscriptions:\n")
    b.topology_file.write_text(text)
    nc.run_measured(nc.cli("apply", "-t", str(b.topology_file)), b.env, "airflow-repl apply")
    added, summary = _snapshot(b)
    if list(summary.get("tables", {})) != [f"public.{TABLE}"]:
        raise nc.BenchFailure(f"adding the article copied {sorted(summary.get('tables', {}))}, not {TABLE} alone")
    full, everything = _snapshot(b, "--reinitialize")

    rows = args.article_rows
    label = f"add one {rows:,}-row article to a publication of {b.extra['accounts_rows']:,} accounts rows"
    b.rows.append(nc.row(f"{label}: REFRESH PUBLICATION / the Snapshot Agent copying it alone", native, added, "s"))
    b.rows.append(nc.row(f"{label}: REFRESH PUBLICATION / a full reinitialize (every article)", native, full, "s"))
    b.rows.append(
        nc.row("of which the Snapshot Agent's own run, copying the article alone", None, summary["seconds"], "s", False)
    )
    b.rows.append(
        nc.row("of which the Snapshot Agent's own run, a full reinitialize", None, everything["seconds"], "s", False)
    )
    copy = summary["copies"][0]  # the article's copy: COPY out, its Parquet file and COPY in (read_seconds)
    start = _floor_rows(b, native, added, summary["seconds"], copy["read_seconds"], copy.get("import_seconds", 0.0))
    b.extra["add_vs_full_reinitialize"] = round(added / full, 3) if full else None
    b.extra["own_runs"] = {"add": summary["seconds"], "full_reinitialize": everything["seconds"]}
    b.extra["add_breakdown"] = {k: copy[k] for k in ("plan_seconds", "read_seconds", "load_seconds")}
    b.extra["add_floor"] = {"process_start": start, "copy": copy["read_seconds"]}
    print(f"the copy of the article alone: {b.extra['add_breakdown']} (the rest of {added:.2f} s: start, bookkeeping)")
    b.extra["article_rows"] = rows
    query = nc.checksum_sql(TABLE, "id")  # the other tables: check_checksums
    if not nc.query_one(b.pub, query) == nc.query_one(b.sub, query) == nc.query_one(b.native, query):
        raise nc.BenchFailure(f"{TABLE} differs between the publisher and a subscriber")
    nc.check_checksums(b, "after adding the article")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b = nc.Bench(tempfile.mkdtemp(prefix="airflow-repl-add-article-"))
    status = 0
    try:
        b.start({})
        run(b, args)
    except nc.BenchFailure as exc:
        print(f"add_article: error: {exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        print(nc.format_table(b.rows), flush=True)
        ratio = b.extra.get("add_vs_full_reinitialize")
        if ratio is not None:
            print(f"adding the article alone took {ratio:.2f}x the time of a full reinitialize", flush=True)
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(nc.results_json(b.rows, {"args": vars(args), **b.extra}) + "\n")
        print(f"results written to {path}", flush=True)
        b.sb.destroy()
        shutil.rmtree(b.root, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
