"""Peak memory of the Log Reader and Distribution Agents on large work (``make bench``; issue 12
point 5): one transaction of ``--single-transaction`` row changes, then a backlog of ``--backlog``
row changes in transactions of ``--per-transaction`` rows.

Uses the sandbox, tables and topology of ``native_compare.py`` (pgbench scale 1, our subscriber
and a native ``CREATE SUBSCRIPTION`` beside it). Each agent runs as a CLI process, like a user runs
it; the resident memory of its whole process tree is sampled every 100 ms. The native subscription
is stopped while each phase writes, then started and timed until it shows the phase's last
transaction, before our agents run (the two never compete), and the table reports both. After each phase every
table's checksum must match at the publisher, our subscriber and the native subscriber. The
benchmark exits with 1 when a checksum differs or a peak is above ``--limit-mib`` (default 1024).
Writes the figures as JSON (``--json``). See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from native_compare import (  # the benchmark next to this one
    Bench,
    BenchFailure,
    check_checksums,
    cli,
    execute,
    format_table,
    heartbeat_seq,
    native_catch_up,
    phase_initial,
    results_json,
    row,
    run_measured,
    setup,
)

DEFAULT_JSON = "benchmarks/results/memory_bound.json"
BACKLOG_PROCEDURE = """
CREATE PROCEDURE public.bench_backlog(changes bigint, per int) LANGUAGE plpgsql AS $$
DECLARE first int;
BEGIN
    FOR i IN 0 .. changes / per - 1 LOOP
        first := (i * per) %% (100000 - per) + 1;
        UPDATE public.pgbench_accounts SET abalance = abalance + 1 WHERE aid BETWEEN first AND first + per - 1;
        COMMIT;
    END LOOP;
END $$"""


def run_agents(b: Bench, label: str, limit: float, marker: int, native: float) -> None:
    """Log reader then distribution, measured (native caught up before them, in ``native``
    seconds); the subscriber must then have the ``marker`` transaction."""
    topo = ["-t", str(b.topology_file), "-p", "bench"]
    lr, lr_peak, out = run_measured(cli("logreader", *topo), b.env, "airflow-repl logreader")
    di, di_peak, _ = run_measured(cli("distribution", *topo), b.env, "airflow-repl distribution")
    if heartbeat_seq(b.sub) < marker:
        raise BenchFailure(f"{label}: the subscriber did not receive the last transaction in one run of each agent")
    commands = json.loads(out).get("commands")
    b.rows.append(row(f"{label} ({commands:,} commands): log reader", None, lr, "s", compare=False))
    b.rows.append(row(f"{label}: distribution", None, di, "s", compare=False))
    b.rows.append(row(f"{label}: total (log reader + distribution)", native, lr + di, "s"))
    b.rows.append(row(f"{label}: peak RSS, log reader (CLI)", None, lr_peak, "MiB", compare=False))
    b.rows.append(row(f"{label}: peak RSS, distribution (CLI)", None, di_peak, "MiB", compare=False))
    b.extra.setdefault("peaks_mib", {})[label] = {"logreader": round(lr_peak), "distribution": round(di_peak)}
    check_checksums(b, label)
    for agent, peak in (("log reader", lr_peak), ("distribution", di_peak)):
        if peak > limit:
            raise BenchFailure(f"{label}: the {agent}'s peak resident memory {peak:.0f} MiB is above {limit:.0f} MiB")


def timed_write(b: Bench, key: str, query: str, params: tuple[int, ...]) -> None:
    t0 = time.monotonic()
    execute(b.pub, query, params)
    b.extra[key] = round(time.monotonic() - t0, 1)


def phase_single_transaction(b: Bench, changes: int, limit: float) -> None:
    insert = (
        "INSERT INTO public.pgbench_history (tid, bid, aid, delta, mtime)"
        " SELECT 1, 1, g %% 100000 + 1, 1, now() FROM generate_series(1, %s) g"
    )
    marker, native = native_catch_up(b, lambda: timed_write(b, "single_transaction_write_seconds", insert, (changes,)))
    run_agents(b, f"one transaction of {changes:,} inserts", limit, marker, native)


def phase_backlog(b: Bench, changes: int, per: int, limit: float) -> None:
    execute(b.pub, BACKLOG_PROCEDURE)
    call = "CALL public.bench_backlog(%s, %s)"
    marker, native = native_catch_up(b, lambda: timed_write(b, "backlog_write_seconds", call, (changes, per)))
    run_agents(b, f"backlog of {changes:,} updates in transactions of {per:,}", limit, marker, native)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--single-transaction", type=int, default=5_000_000, help="rows of the one big transaction")
    parser.add_argument("--backlog", type=int, default=10_000_000, help="row changes of the backlog")
    parser.add_argument("--per-transaction", type=int, default=1000, help="row changes per backlog transaction")
    parser.add_argument("--limit-mib", type=float, default=1024, help="fail above this peak (default 1024)")
    parser.add_argument("--bulk-apply", action="store_true", help="give our subscription bulk_apply: true")
    parser.add_argument("--json", default=DEFAULT_JSON, help=f"where to write the results (default {DEFAULT_JSON})")
    args = parser.parse_args(argv)
    for name in ("single_transaction", "backlog", "per_transaction", "limit_mib"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.per_transaction > 50_000:
        parser.error("--per-transaction must be at most 50000 (the accounts of pgbench scale 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b = Bench(tempfile.mkdtemp(prefix="airflow-repl-memory-"))
    status = 0
    try:
        b.start({"bulk_apply": True} if args.bulk_apply else {})
        setup(b, 1)
        phase_initial(b)
        phase_single_transaction(b, args.single_transaction, args.limit_mib)
        phase_backlog(b, args.backlog, args.per_transaction, args.limit_mib)
    except BenchFailure as exc:
        print(f"memory_bound: error: {exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        print(format_table(b.rows), flush=True)
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        info: dict[str, Any] = {"args": vars(args), **b.extra}
        path.write_text(results_json(b.rows, info) + "\n")
        print(f"results written to {path}", flush=True)
        b.sb.destroy()
        shutil.rmtree(b.root, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
