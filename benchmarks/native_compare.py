"""airflow-repl against PostgreSQL's native logical replication, side by side in one run (``make bench``).

Starts a private sandbox of three clusters: ``publisher`` (the pgbench database and our distribution
database), ``subscriber`` (our subscriber) and ``native`` (a ``CREATE SUBSCRIPTION`` to the same
tables).  Then, for both, in the same run and one after the other (never at the same time):

1. initial sync: ``airflow-repl snapshot`` as a user runs it (a CLI subprocess: without
   $AIRFLOW_REPL_SPARK_MASTER its read tasks run in threads of the CLI) against ``CREATE
   SUBSCRIPTION ... copy_data`` until every table is ready; then the same snapshot again
   (``--reinitialize``) in a local Spark application (``local[2]``, its start included), the way a
   Spark master makes the CLI, and the operators always, run it;
2. catch-up of a backlog of ``--transactions`` pgbench transactions written while both were
   stopped: ``airflow-repl logreader`` then ``airflow-repl distribution`` against ``ENABLE``
   until the last transaction is applied;
3. live lag under ``--tps`` pgbench transactions per second for ``--lag-seconds``: our agents run
   side by side with ``--continuous`` when they have it, else in a loop of one-shot runs as fast
   as they can, while a heartbeat row is updated every 100 ms at the publisher;
   the lag is the age of the heartbeat each subscriber shows, sampled every 200 ms;
4. sustained throughput: pgbench's ``--rate`` raised step by step (``--sustained-start``, then
   ``--sustained-step`` more each time, up to ``--sustained-max``), each rate held for
   ``--sustained-window`` seconds, against each system alone (native with our agents stopped; our
   Log Reader and Distribution Agent side by side, continuous, with the native subscription
   disabled), until a rate is not held: the highest rate held (pgbench reached it, the lag's p95
   under ``SUSTAINED_P95`` seconds and not growing, :func:`held`) with the CPU by role at it.

After each phase every table's checksum must match at the publisher, our subscriber and the native
subscriber, or the benchmark exits with 1 naming the table.  Prints ``phase | native |
airflow-repl | ratio`` and writes the same as JSON (``--json``).  See docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HEARTBEAT_SECONDS = 0.1
SAMPLE_SECONDS = 0.2
POLL_SECONDS = 0.05
TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history", "bench_heartbeat")
KEYS = {
    "pgbench_accounts": "aid",
    "pgbench_branches": "bid",
    "pgbench_tellers": "tid",
    "pgbench_history": "id",
    "bench_heartbeat": "id",
}
#: Phase 3 with continuous mode: both agents side by side, looking every CONTINUOUS_POLL seconds when idle.
CONTINUOUS_AGENTS = ("logreader", "distribution")
CONTINUOUS_POLL = 0.1
DEFAULT_JSON = "benchmarks/results/native_compare.json"


class BenchFailure(Exception):
    """The benchmark cannot go on (a checksum differs, a phase never finishes)."""


#: Sustained throughput: a rate is held when the lag's p95 over the window stays under this many seconds ...
SUSTAINED_P95 = 2.0
#: ... the lag grew by less than this many seconds from the window's first quarter to its last
#: (medians: a backlog that builds up shows as a lag that keeps growing) ...
SUSTAINED_GROWTH = 0.5
#: ... and pgbench reached at least this share of the rate asked for (the publisher kept up).
SUSTAINED_REACHED = 0.95


# ---------------------------------------------------------------------------- pure parts (unit-tested)
def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0..100) by linear interpolation between closest ranks; None when empty."""
    if not values:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is not between 0 and 100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def ratio(ours: float | None, native: float | None) -> float | None:
    """ours / native (below 1.0: we are faster), None when either is missing or native is 0."""
    if ours is None or native is None or native == 0:
        return None
    return ours / native


def row(phase: str, native: float | None, ours: float | None, unit: str, compare: bool = True) -> dict[str, Any]:
    """One line of the result table."""
    return {
        "phase": phase,
        "unit": unit,
        "native": native,
        "airflow_repl": ours,
        "ratio": ratio(ours, native) if compare else None,
    }


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value:.0f} {unit}" if unit == "MiB" else f"{value:.2f} {unit}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table: phase | native | airflow-repl | ratio (ours/native)."""
    lines = ["| phase | native | airflow-repl | ratio (ours/native) |", "|---|---|---|---|"]
    for r in rows:
        rat = "—" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(
            f"| {r['phase']} | {_cell(r['native'], r['unit'])} | {_cell(r['airflow_repl'], r['unit'])} | {rat} |"
        )
    return "\n".join(lines)


def results_json(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    """The run's result file: when, where, with which arguments, and the rows."""
    return json.dumps({**info, "rows": rows}, indent=2, default=str)


def held(lags: Sequence[float], rate: float, achieved: float) -> tuple[bool, str]:
    """Whether a step of the sustained phase held ``rate`` (pgbench's ``achieved`` tps and the lag
    samples, oldest first, over its window), and the figure that decided it."""
    p95 = percentile(lags, 95)
    if p95 is None or len(lags) < 8:
        return False, "too few lag samples"
    quarter = len(lags) // 4
    growth = percentile(lags[-quarter:], 50) - percentile(lags[:quarter], 50)  # type: ignore[operator]
    if achieved < SUSTAINED_REACHED * rate:
        return False, f"pgbench reached {achieved:,.0f} tps only"
    if p95 >= SUSTAINED_P95:
        return False, f"lag p95 {p95:.2f} s"
    if growth >= SUSTAINED_GROWTH:
        return False, f"lag grew {growth:.2f} s over the window"
    return True, f"lag p95 {p95:.2f} s, growth {growth:+.2f} s"


def rates(start: int, step: int, most: int) -> list[int]:
    """The sustained phase's rates: ``start``, then ``step`` more each time, up to ``most``."""
    return list(range(start, most + 1, step))


def checksum_sql(table: str, key: str) -> Any:
    """Row count and a digest of a whole table (the md5 of each row's text, in key order)."""
    from psycopg import sql

    return sql.SQL(
        "SELECT count(*), md5(coalesce(string_agg(md5(t::text), '' ORDER BY t.{key}), '')) FROM public.{table} t"
    ).format(key=sql.Identifier(key), table=sql.Identifier(table))


# ---------------------------------------------------------------------------- processes and memory
class PeakRss:
    """Samples the memory of a process and all its descendants (the CLI's Python, the Spark driver
    JVM it starts and the JVM's Python workers) every 100 ms.  Peaks: ``peak_mib``, the largest sum
    of resident sets (pages the forked Python workers share counted once per process);
    ``peak_pss_mib``, the largest sum of proportional set sizes (each shared page split among the
    processes sharing it: what the tree really holds); ``peak_driver_mib``, the largest resident
    sum of the CLI and the JVM alone (the Spark driver, without its local executor's workers)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.peak_pss, self.peak_driver = pid, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> tuple[int, int, int]:
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0, 0, 0
        rss = pss = driver = 0
        for proc in procs:
            try:
                resident = proc.memory_info().rss
                worker = proc is not root and proc.name().startswith("python")
            except psutil.Error:
                continue
            rss += resident
            pss += _pss(proc.pid) or resident
            if not worker:
                driver += resident
        return rss, pss, driver

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss, pss, driver = self._sample()
            self.peak, self.peak_pss = max(self.peak, rss), max(self.peak_pss, pss)
            self.peak_driver = max(self.peak_driver, driver)
            self._stop.wait(0.1)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20

    @property
    def peak_pss_mib(self) -> float:
        return self.peak_pss / 2**20

    @property
    def peak_driver_mib(self) -> float:
        return self.peak_driver / 2**20


def _pss(pid: int) -> int:
    """The process's proportional set size in bytes (``/proc/PID/smaps_rollup``; 0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------------------- CPU by process role
def process_role(title: str) -> str:
    """A PostgreSQL server process's role from its title (``update_process_title``):
    ``walsender``, ``apply worker`` (a subscription's: ``logical replication worker for
    subscription ...``, ``logical replication apply worker ...`` since PostgreSQL 17),
    ``backend <database>`` (a client's: ``<user> <database> <host(port)> <activity>``), else
    ``background`` (checkpointer, WAL writer, autovacuum, the launchers...)."""
    text = title.strip().removeprefix("postgres: ")
    if text.startswith("walsender"):
        return "walsender"
    if text.startswith(
        ("logical replication worker", "logical replication apply worker", "logical replication tablesync")
    ):
        # a table synchronization worker: "... for subscription N sync R" (PostgreSQL 15, 16)
        return "table sync worker" if " sync " in text or "tablesync" in text else "apply worker"
    words = text.split()
    if len(words) >= 3 and (words[2].endswith(")") or words[2] == "[local]"):
        return f"backend {words[1]}"
    return "background"


def _proc_times(pid: int) -> tuple[float, float, float] | None:
    """(start time, own CPU seconds, CPU seconds of its reaped children) of a process (user +
    system, psutil); None when it is gone."""
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            times = proc.cpu_times()
            return proc.create_time(), times.user + times.system, times.children_user + times.children_system
    except psutil.Error:
        return None


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def _title(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


#: :class:`CpuByRole`'s role for a cluster's postmaster and the last moments of the processes that
#: ended between two readings.
ENDED = "postmaster, and what ended between readings"


class CpuByRole:
    """CPU seconds (user + system) of the clusters' server processes by role (:func:`process_role`)
    while a step runs (psutil): each postmaster's children read every 50 ms (looked for
    every 0.5 s).  Each cluster's total is exact: the postmaster's own time and its reaped
    children's (``cutime``) count what ended between two readings; that remainder (a process's
    last tens of milliseconds) and the postmaster's own time are the role ``postmaster, and what
    ended between readings``."""

    EVERY = 0.05
    LOOK_EVERY = 10  # readings between looks for new processes

    def __init__(self, servers: dict[str, int]) -> None:
        self.servers = servers  # cluster -> its postmaster's pid
        self._seen: dict[tuple[int, float], list[Any]] = {}  # (pid, start) -> [cluster, role, first, last]
        self._postmaster = {name: _proc_times(pid) for name, pid in servers.items()}
        self._look(first=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _look(self, first: bool = False) -> None:
        for cluster, postmaster in self.servers.items():
            for pid in _children(postmaster):
                times = _proc_times(pid)
                if times is None:
                    continue
                start, cpu, _ = times
                if (pid, start) not in self._seen:  # born during the step: all its time is the step's
                    self._seen[(pid, start)] = [cluster, process_role(_title(pid)), cpu if first else 0.0, cpu]

    def _read(self) -> None:
        for (pid, start), entry in self._seen.items():
            times = _proc_times(pid)
            if times is not None and times[0] == start:
                entry[3] = times[1]

    def _loop(self) -> None:
        n = 0
        while not self._stop.wait(self.EVERY):
            n += 1
            if n % self.LOOK_EVERY == 0:
                self._look()
            self._read()

    def stop(self) -> dict[str, dict[str, float]]:
        """cluster -> role -> CPU seconds during the step."""
        self._stop.set()
        self._thread.join()
        self._look()
        self._read()
        out: dict[str, dict[str, float]] = {name: {} for name in self.servers}
        alive: set[tuple[int, float]] = set()
        for (pid, start), (cluster, role, first, last) in self._seen.items():
            out[cluster][role] = out[cluster].get(role, 0.0) + last - first
            times = _proc_times(pid)
            if times is not None and times[0] == start:
                alive.add((pid, start))
        for name, pid in self.servers.items():
            before, after = self._postmaster[name], _proc_times(pid)
            if before is None or after is None:
                continue
            # the postmaster's own time and its reaped children's whole lives, less what those
            # children had used before the step
            exact = (after[1] + after[2]) - (before[1] + before[2])
            exact -= sum(e[2] for k, e in self._seen.items() if e[0] == name and k not in alive)
            exact += sum(e[3] - e[2] for k, e in self._seen.items() if e[0] == name and k in alive)
            rest = exact - sum(out[name].values())
            out[name][ENDED] = max(0.0, rest)
        return {name: {role: round(v, 3) for role, v in roles.items()} for name, roles in out.items()}


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have been waited for."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_measured(
    cmd: list[str], env: dict[str, str], what: str, memory: dict[str, float] | None = None
) -> tuple[float, float, str]:
    """Run ``cmd``; returns (wall seconds, peak resident MiB of its process tree, stdout).  Fails
    naming ``what``.  ``memory``, when given, receives the other peaks of :class:`PeakRss`
    (``pss_mib``, ``driver_mib``)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rss = PeakRss(proc.pid)
    out, err = proc.communicate()
    seconds = time.monotonic() - t0
    peak = rss.stop()
    if memory is not None:
        memory.update(pss_mib=rss.peak_pss_mib, driver_mib=rss.peak_driver_mib)
    if proc.returncode != 0:
        raise BenchFailure(f"{what} failed (exit {proc.returncode}): {err.strip()[-2000:]}")
    return seconds, peak, out


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow_repl.cli", *args]


# ---------------------------------------------------------------------------- the bench environment
class Bench:
    """The sandbox, its databases, the topology file and the helpers every phase uses."""

    def __init__(self, root: str) -> None:
        from airflow_repl.sandbox import Sandbox

        self.root = Path(root)
        self.sb = Sandbox(self.root / "sandbox", clusters=("publisher", "subscriber", "native"))
        self.rows: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.stop_file = self.root / "agent-loop.stop"
        self.native_cpu: dict[str, dict[str, float]] = {}  # the last native catch-up's CPU by role

    def start(self, subscription_options: dict[str, Any]) -> None:
        from airflow_repl.engine.postgres.connections import to_uri

        self.sb.start()
        self.pub = self.sb.create_database("publisher", "bench_pub", recreate=True)
        self.dist = self.sb.create_database("publisher", "bench_dist", recreate=True)
        self.sub = self.sb.create_database("subscriber", "bench_sub", recreate=True)
        self.native = self.sb.create_database("native", "bench_native", recreate=True)
        self.env = {
            **os.environ,
            "AIRFLOW_CONN_BENCH_PUB": to_uri(self.pub),
            "AIRFLOW_CONN_BENCH_DIST": to_uri(self.dist),
            "AIRFLOW_CONN_BENCH_SUB": to_uri(self.sub),
        }
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("AIRFLOW_CONN_BENCH_")})
        self.topology_file = self.root / "topology.yaml"
        # The servers as URIs (the file is 0600): a connection id would make each agent's CLI process
        # import Airflow to look it up (about 2 s of CPU here), which the agents run by the operators
        # never pay (the operator resolves the topology in the worker and hands the job a spec).
        servers = {"publisher": to_uri(self.pub), "distributor": to_uri(self.dist), "s": to_uri(self.sub)}
        self.topology_file.write_text(topology_yaml(self.root / "snapshots", subscription_options, servers))
        os.chmod(self.topology_file, 0o600)

    def cpu_by_role(self) -> CpuByRole:
        """Start counting the CPU of the three clusters' processes by role."""
        return CpuByRole({name: self.sb.server_pid(name) for name in ("publisher", "subscriber", "native")})

    def pg_env(self, conninfo: str) -> dict[str, str]:
        """libpq environment for a client program: the password never on a command line."""
        from psycopg.conninfo import conninfo_to_dict

        p = conninfo_to_dict(conninfo)
        return {
            **os.environ,
            "PGHOST": str(p["host"]),
            "PGPORT": str(p["port"]),
            "PGUSER": str(p["user"]),
            "PGPASSWORD": str(p["password"]),
            "PGDATABASE": str(p["dbname"]),
        }

    def pg_tool(self, name: str, args: list[str], conninfo: str, stdin: str | None = None) -> str:
        res = subprocess.run(
            [str(self.sb.bindir / name), *args],
            env=self.pg_env(conninfo),
            input=stdin,
            capture_output=True,
            text=True,
            cwd="/",
        )
        if res.returncode != 0:
            raise BenchFailure(f"{name} {' '.join(args)} failed: {res.stderr.strip()[-2000:]}")
        return res.stdout

    def topology(self):
        from airflow_repl.hooks.connections import load_topology

        return load_topology(self.topology_file)


def topology_yaml(snapshots: Path, subscription_options: dict[str, Any], servers: dict[str, str] | None = None) -> str:
    """The benchmark's topology: the five tables with default article options, one subscription.
    ``servers``: publisher, distributor and subscriber ``s`` (default: the connection ids
    ``bench_pub``, ``bench_dist``, ``bench_sub``)."""
    names = {"publisher": "bench_pub", "distributor": "bench_dist", "s": "bench_sub", **(servers or {})}
    articles = "".join(f"      - table: public.{t}\n" for t in TABLES)
    options = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in subscription_options.items())
    return (
        f"publisher: {json.dumps(names['publisher'])}\ndistributor: {json.dumps(names['distributor'])}\n"
        f"subscribers:\n  s: {json.dumps(names['s'])}\n"
        f"snapshot_folder: {snapshots}\npublications:\n  - name: bench\n    articles:\n{articles}"
        f"subscriptions:\n  - publication: bench\n    subscriber: s\n{options}"
    )


def wait_for(check: Callable[[], bool], what: str, timeout: float) -> float:
    """Poll ``check`` every 50 ms; returns the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchFailure(f"{what}: not done after {timeout:.0f} s")
        time.sleep(POLL_SECONDS)
    return time.monotonic()


def query_one(conninfo: str, query: str, params: Sequence[Any] = ()) -> Any:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(query, params).fetchone()


def execute(conninfo: str, query: Any, params: Sequence[Any] = ()) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(query, params)


def heartbeat_seq(conninfo: str) -> int:
    return int(query_one(conninfo, "SELECT seq FROM public.bench_heartbeat WHERE id = 1")[0])


def mark(b: Bench) -> int:
    """A last transaction at the publisher; a subscriber showing its seq has applied everything before it."""
    return int(
        query_one(b.pub, "UPDATE public.bench_heartbeat SET seq = seq + 1, at = clock_timestamp() RETURNING seq")[0]
    )


# ---------------------------------------------------------------------------- setup
def setup(b: Bench, scale: int) -> None:
    """pgbench tables (pgbench_history given a key) and a heartbeat table at the publisher; the same
    schema at the native subscriber; a native publication; our topology applied."""
    from psycopg import sql

    b.pg_tool("pgbench", ["-i", "-q", "-s", str(scale)], b.pub)
    execute(b.pub, "ALTER TABLE public.pgbench_history ADD COLUMN id bigserial PRIMARY KEY")
    execute(
        b.pub, "CREATE TABLE public.bench_heartbeat (id int PRIMARY KEY, seq bigint NOT NULL, at timestamptz NOT NULL)"
    )
    execute(b.pub, "INSERT INTO public.bench_heartbeat VALUES (1, 0, clock_timestamp())")
    schema = b.pg_tool("pg_dump", ["--schema-only", "--no-owner", "--no-privileges"], b.pub)
    b.pg_tool("psql", ["-q", "-v", "ON_ERROR_STOP=1"], b.native, stdin=schema)
    tables = sql.SQL(", ").join(sql.Identifier("public", t) for t in TABLES)
    execute(b.pub, sql.SQL("CREATE PUBLICATION native_pub FOR TABLE {}").format(tables))
    seconds, _, _ = run_measured(cli("apply", "-t", str(b.topology_file)), b.env, "airflow-repl apply")
    b.extra["apply_seconds"] = round(seconds, 2)
    b.extra["accounts_rows"] = int(query_one(b.pub, "SELECT count(*) FROM public.pgbench_accounts")[0])


def native_conninfo(b: Bench) -> str:
    """The native subscription's connection to the publisher: the password in a passfile the
    server user reads, not in the catalog or a statement."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    p = conninfo_to_dict(b.pub)
    passfile = b.sb._pg_base() / ".bench-pgpass"
    passfile.write_text(f"{p['host']}:{p['port']}:*:{p['user']}:{p['password']}\n")
    os.chmod(passfile, 0o600)
    b.sb._chown(passfile)
    return make_conninfo(host=p["host"], port=p["port"], user=p["user"], dbname=p["dbname"], passfile=str(passfile))


# ---------------------------------------------------------------------------- phases
def native_ready(b: Bench) -> bool:
    waiting, total = query_one(
        b.native, "SELECT count(*) FILTER (WHERE srsubstate <> 'r'), count(*) FROM pg_catalog.pg_subscription_rel"
    )
    return waiting == 0 and total == len(TABLES)


def phase_initial(b: Bench) -> None:
    from psycopg import sql

    rows = b.extra["accounts_rows"]
    conninfo = native_conninfo(b)
    cpu = b.cpu_by_role()
    t0 = time.monotonic()
    execute(
        b.native,
        sql.SQL("CREATE SUBSCRIPTION native_sub CONNECTION {} PUBLICATION native_pub").format(sql.Literal(conninfo)),
    )
    native = wait_for(lambda: native_ready(b), "native initial sync", 3600) - t0
    native_cpu = cpu.stop()
    cpu, cli_before = b.cpu_by_role(), children_cpu()
    ours = snapshot_run(b, native, f"initial sync, {rows:,} accounts rows", {}, [])
    ours_cpu, cli_cpu = cpu.stop(), children_cpu() - cli_before
    # the CLI's own CPU, its read tasks included (a Spark run's JVM is not its child to count)
    if ours.get("tasks") == "threads":
        b.rows.extend(initial_cpu_rows(native_cpu, ours_cpu, cli_cpu))
        b.extra["initial_sync_cpu_by_role"] = {"native": native_cpu, "airflow_repl": ours_cpu, "cli": round(cli_cpu, 3)}
    check_checksums(b, "initial sync")
    if ours.get("tasks") == "threads":
        # the same snapshot through a local Spark application, as a Spark master makes the CLI run it
        # (the operators always run it in one): the subscription initialized again
        spark = {"AIRFLOW_REPL_SPARK_MASTER": "local[2]"}
        snapshot_run(b, native, "initial sync again, in a local Spark application", spark, ["--reinitialize"])
        check_checksums(b, "initial sync in Spark")


def snapshot_run(b: Bench, native: float, label: str, env: dict[str, str], extra: list[str]) -> dict[str, Any]:
    """One ``airflow-repl snapshot`` run (``extra`` arguments, ``env`` added to the bench's
    environment) measured against native's initial sync: its rows; its summary."""
    memory: dict[str, float] = {}
    seconds, peak, out = run_measured(
        cli("snapshot", "-t", str(b.topology_file), "-p", "bench", *extra), b.env | env, "airflow-repl snapshot", memory
    )
    summary = json.loads(out)
    threads = summary.get("tasks") == "threads"
    where = "read tasks in threads of the CLI, no Spark" if threads else "incl. Spark's start"
    b.rows.append(row(f"{label} (ours: the CLI, {where})", native, seconds, "s"))
    parts = [
        ("the Snapshot Agent's own run (after the process start)", summary["seconds"]),
        ("of which planning the partitions", summary.get("plan_seconds")),
        (
            "of which waiting for Spark (started in the background)",
            None if threads else summary.get("spark_wait_seconds"),
        ),
        ("of which reading the publisher and loading the subscriber (one pass)", summary["read_seconds"]),
        ("of which preparing and activating the subscriber (keys, checks)", summary["load_seconds"]),
    ]
    for what, value in parts:
        if value is not None:
            b.rows.append(row(f"{label}: {what}", None, value, "s", False))
    driver = "the CLI" if threads else "Spark driver (CLI + JVM)"
    b.rows.append(row(f"{label}: peak RSS, {driver}", None, memory["driver_mib"], "MiB", False))
    if not threads:
        b.rows.append(row(f"{label}: peak RSS sum, with the Python workers", None, peak, "MiB", False))
        b.rows.append(
            row(
                f"{label}: peak PSS, with the Python workers (shared pages once)", None, memory["pss_mib"], "MiB", False
            )
        )
    return summary


def pgbench_load(b: Bench, *args: str) -> float:
    """pgbench's TPC-B-like transactions at the publisher, two clients; returns the tps it reports."""
    return achieved_tps(b.pg_tool("pgbench", ["-n", "-c", "2", "-j", "2", *args], b.pub))


def achieved_tps(pgbench_output: str) -> float:
    """The ``tps = N`` figure of pgbench's report."""
    found = re.search(r"^tps = ([0-9.]+)", pgbench_output, re.MULTILINE)
    if found is None:
        raise BenchFailure(f"pgbench printed no tps figure: {pgbench_output.strip()[-500:]}")
    return float(found.group(1))


def backlog(b: Bench, transactions: int, key: str) -> tuple[int, float]:
    """Native stopped, a backlog of pgbench ``transactions`` and a marker written, then native
    started again: returns the marker and native's seconds from ENABLE until it shows it."""

    def load() -> None:
        b.extra[key] = pgbench_load(b, "-t", str(max(1, transactions // 2)))

    return native_catch_up(b, load)


def native_catch_up(b: Bench, write: Callable[[], object], timeout: float = 7200) -> tuple[int, float]:
    """Native stopped, ``write()`` and a marker committed at the publisher, then native started
    again: returns the marker and native's seconds from ENABLE until it shows it."""
    execute(b.native, "ALTER SUBSCRIPTION native_sub DISABLE")
    wait_for(
        lambda: query_one(b.native, "SELECT count(pid) FROM pg_catalog.pg_stat_subscription")[0] == 0,
        "native apply worker stop",
        60,
    )
    write()
    marker = mark(b)
    cpu = b.cpu_by_role()
    t0 = time.monotonic()
    execute(b.native, "ALTER SUBSCRIPTION native_sub ENABLE")
    seconds = wait_for(lambda: heartbeat_seq(b.native) >= marker, "native catch-up", timeout) - t0
    b.native_cpu = cpu.stop()
    return marker, seconds


def phase_catchup(b: Bench, transactions: int) -> None:
    marker, native = backlog(b, transactions, "catch_up_load_tps")
    topo = ["-t", str(b.topology_file), "-p", "bench"]
    native_cpu = b.native_cpu
    agents = [children_cpu()]
    cpu = b.cpu_by_role()
    lr, lr_peak, out = run_measured(cli("logreader", *topo), b.env, "airflow-repl logreader")
    lr_cpu, agents = cpu.stop(), [*agents, children_cpu()]
    cpu = b.cpu_by_role()
    di, di_peak, dout = run_measured(cli("distribution", *topo), b.env, "airflow-repl distribution")
    di_cpu, agents = cpu.stop(), [*agents, children_cpu()]
    if heartbeat_seq(b.sub) < marker:
        raise BenchFailure(
            "catch-up: our subscriber did not receive the last transaction in one log reader + distribution run"
        )
    changes = json.loads(out).get("commands")
    label = f"catch-up of {2 * max(1, transactions // 2):,} pgbench transactions ({changes:,} row changes)"
    b.rows.append(row(f"{label}: log reader", None, lr, "s", compare=False))
    b.rows.append(row(f"{label}: distribution", None, di, "s", compare=False))
    b.rows.append(row(f"{label}: total (log reader + distribution)", native, lr + di, "s"))
    inside = json.loads(out)["seconds"] + sum(s["seconds"] for s in json.loads(dout)["subscriptions"])
    b.rows.append(row("catch-up: both agents' own runs (without process start)", None, inside, "s", compare=False))
    b.rows.append(row("peak RSS, log reader (CLI)", None, lr_peak, "MiB", compare=False))
    b.rows.append(row("peak RSS, distribution (CLI)", None, di_peak, "MiB", compare=False))
    b.rows.extend(cpu_rows(native, native_cpu, lr_cpu, di_cpu, agents[1] - agents[0], agents[2] - agents[1]))
    b.extra["catch_up_cpu_by_role"] = {"native": native_cpu, "log_reader": lr_cpu, "distribution": di_cpu}
    check_checksums(b, "catch-up")


def initial_cpu_rows(
    native_cpu: dict[str, dict[str, float]], ours_cpu: dict[str, dict[str, float]], cli_cpu: float
) -> list[dict[str, Any]]:
    """The initial sync's CPU seconds by side for both (:class:`CpuByRole`; our CLI's from its
    rusage): the publisher's processes reading the tables (native: its table sync walsenders; ours:
    the read tasks' backends and the slot's walsender), the subscriber's loading them and building
    the keys, our distribution database's, our CLI's (reading the Arrow batches, writing the
    Parquet files and the COPY text), and every process."""

    def total(cpu: dict[str, dict[str, float]], cluster: str, leave_out: Sequence[str] = ()) -> float:
        return sum(v for k, v in cpu.get(cluster, {}).items() if k not in leave_out)

    native_pub = total(native_cpu, "publisher")
    # the benchmark's own polling of the native subscriber (a connection every 50 ms) is left out
    native_sub = total(native_cpu, "native", ("backend bench_native", ENDED))
    ours_pub = total(ours_cpu, "publisher", ("backend bench_dist",))
    ours_dist = ours_cpu.get("publisher", {}).get("backend bench_dist", 0.0)
    ours_sub = total(ours_cpu, "subscriber")
    label = "initial sync CPU seconds (ours: the CLI, read tasks in threads)"
    return [
        row(f"{label}: the publisher's processes (reading the tables)", native_pub, ours_pub, "s"),
        row(f"{label}: the subscriber's processes (loading the rows, building the keys)", native_sub, ours_sub, "s"),
        row(f"{label}: our distribution database", None, ours_dist, "s", False),
        row(f"{label}: our CLI's process (Arrow batches, Parquet files, COPY text)", None, cli_cpu, "s", False),
        row(
            f"{label}: every process (servers and ours)",
            native_pub + native_sub,
            ours_pub + ours_dist + ours_sub + cli_cpu,
            "s",
        ),
    ]


def cpu_rows(
    native: float,
    native_cpu: dict[str, dict[str, float]],
    lr_cpu: dict[str, dict[str, float]],
    di_cpu: dict[str, dict[str, float]],
    lr_agent: float,
    di_agent: float,
) -> list[dict[str, Any]]:
    """The catch-up's CPU seconds by role for both (:class:`CpuByRole`; our agents' own from
    their rusage), and the floor of our serial parts: the publisher's walsender during the Log
    Reader's run plus our subscriber's backend during the Distribution Agent's, each one process
    whose CPU time its agent's run cannot be shorter than, against native's catch-up time."""

    def role(cpu: dict[str, dict[str, float]], cluster: str, name: str) -> float:
        return cpu.get(cluster, {}).get(name, 0.0)

    def total(cpu: dict[str, dict[str, float]], clusters: Sequence[str], leave_out: Sequence[str] = ()) -> float:
        return sum(v for c in clusters for k, v in cpu.get(c, {}).items() if k not in leave_out)

    walsender = role(lr_cpu, "publisher", "walsender") + role(di_cpu, "publisher", "walsender")
    applying = role(lr_cpu, "subscriber", "backend bench_sub") + role(di_cpu, "subscriber", "backend bench_sub")
    dist = role(lr_cpu, "publisher", "backend bench_dist") + role(di_cpu, "publisher", "backend bench_dist")
    ours = total(lr_cpu, ("publisher", "subscriber")) + total(di_cpu, ("publisher", "subscriber")) + lr_agent + di_agent
    # native's: the publisher's and the native subscriber's processes, less the benchmark's own
    # polling of the native subscriber (a connection, so a backend of bench_native, every 50 ms:
    # what the native cluster's postmaster forks and reaps is that)
    theirs = total(native_cpu, ("publisher",)) + total(native_cpu, ("native",), ("backend bench_native", ENDED))
    floor = role(lr_cpu, "publisher", "walsender") + role(di_cpu, "subscriber", "backend bench_sub")
    label = "catch-up CPU seconds"
    return [
        row(
            f"{label}: the publisher's walsender (decoding the WAL)",
            role(native_cpu, "publisher", "walsender"),
            walsender,
            "s",
        ),
        row(
            f"{label}: applying at the subscriber (native: its apply worker; ours: the subscriber's backend)",
            role(native_cpu, "native", "apply worker"),
            applying,
            "s",
        ),
        row(f"{label}: our distribution database (storing, then reading the commands)", None, dist, "s", False),
        row(f"{label}: our Log Reader's process", None, lr_agent, "s", False),
        row(f"{label}: our Distribution Agent's process", None, di_agent, "s", False),
        row(f"{label}: every process (servers and agents)", theirs, ours, "s"),
        row(
            "catch-up floor of our serial parts (walsender CPU in the Log Reader's run + subscriber backend CPU "
            "in the distribution's), against native's catch-up time",
            native,
            floor,
            "s",
        ),
    ]


def running(b: Bench, agents: list[subprocess.Popen[bytes]]) -> bool:
    """True while every agent runs (a BenchFailure naming their log once one has ended)."""
    if any(proc.poll() is not None for proc in agents):
        raise BenchFailure(f"an agent ended early; see {b.root / 'agents.log'}")
    return True


def phase_catchup_side_by_side(b: Bench, transactions: int) -> None:
    """A second backlog caught up by our two agents started together with ``--continuous`` (the
    Distribution Agent applies each batch the Log Reader stores while it reads the next), timed
    from their start until our subscriber shows the marker."""
    marker, native = backlog(b, transactions, "catch_up_side_by_side_load_tps")
    t0 = time.monotonic()
    agents = start_agents(b)
    try:
        ours = wait_for(lambda: running(b, agents) and heartbeat_seq(b.sub) >= marker, "our catch-up", 3600) - t0
    finally:
        stop_agents(b, agents)
    label = f"catch-up of {2 * max(1, transactions // 2):,} pgbench transactions, our agents side by side (continuous)"
    b.rows.append(row(label, native, ours, "s"))
    check_checksums(b, "catch-up side by side")


def check_checksums(b: Bench, phase: str) -> None:
    """Every table equal at the publisher, our subscriber and the native subscriber, or a failure naming it."""
    from airflow_repl.engine.subscriber import validation

    bad = [f"{r['article']} (airflow-repl)" for r in validation.compare(b.topology(), "bench", "s") if not r["match"]]
    for table in TABLES:
        query = checksum_sql(table, KEYS[table])
        if query_one(b.pub, query) != query_one(b.native, query):
            bad.append(f"{table} (native)")
    if bad:
        raise BenchFailure(f"after {phase}: checksums differ from the publisher's for {', '.join(bad)}")
    b.extra.setdefault("checksums", {})[phase] = "every table matches"
    print(f"[{phase}] checksums: every table matches at the publisher, airflow-repl and native", flush=True)


class Ticker:
    """Runs ``work`` on its own connection every ``every`` seconds until stopped."""

    def __init__(self, conninfo: str, every: float, work: Callable[[Any], None]) -> None:
        self.conninfo, self.every, self.work = conninfo, every, work
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self._stop.wait(self.every):
                    self.work(conn)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise BenchFailure(f"background connection failed: {self.error}")


def lag_sampler(conninfo: str, samples: list[float]) -> Ticker:
    """Every 200 ms, the age of the heartbeat the subscriber shows (same machine, same clock)."""

    def sample(conn: Any) -> None:
        (age,) = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - at)::float8 FROM public.bench_heartbeat WHERE id = 1"
        ).fetchone()
        samples.append(age)

    return Ticker(conninfo, SAMPLE_SECONDS, sample)


def start_agents(b: Bench) -> list[subprocess.Popen[bytes]]:
    """Our side of phase 3: the Log Reader and the Distribution Agent side by side with
    ``--continuous`` when the agents have it, else one child process looping one-shot runs."""
    log = (b.root / "agents.log").open("w")
    if continuous_supported():
        options = ["--continuous", "--poll-interval", str(CONTINUOUS_POLL), "--max-run-seconds", "86400"]
        commands = [cli(agent, "-t", str(b.topology_file), "-p", "bench", *options) for agent in CONTINUOUS_AGENTS]
    else:
        loop = [sys.executable, __file__, "--agent-loop", str(b.topology_file), "--stop-file", str(b.stop_file)]
        commands = [loop]
    return [subprocess.Popen(c, env=b.env, stdout=log, stderr=subprocess.STDOUT) for c in commands]


def stop_agents(b: Bench, agents: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM ends a continuous run cleanly; the loop child ends at its stop file."""
    b.stop_file.touch()
    continuous = len(agents) > 1
    for proc in agents:
        if continuous:
            proc.send_signal(signal.SIGTERM)
    for proc in agents:
        if proc.wait(timeout=600) != 0:
            raise BenchFailure(f"an agent of phase 3 failed (exit {proc.returncode}); see {b.root / 'agents.log'}")


def phase_lag(b: Bench, tps: int, seconds: int) -> None:
    agents = start_agents(b)
    rss = [PeakRss(proc.pid) for proc in agents]
    try:
        drain(b, agents)  # both subscribers live (our agents started and caught up) before the load
        lags, drained = live_load(b, agents, tps, seconds)
    finally:
        stop_agents(b, agents)
    add_lag_rows(b, tps, seconds, lags, drained, sum(r.stop() for r in rss))
    check_checksums(b, "live lag")


def live_load(
    b: Bench, agents: list[subprocess.Popen[bytes]], tps: int, seconds: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """pgbench at ``tps`` for ``seconds`` with the heartbeat and the lag samplers; then the drain."""
    beat = Ticker(
        b.pub,
        HEARTBEAT_SECONDS,
        lambda c: c.execute("UPDATE public.bench_heartbeat SET seq = seq + 1, at = clock_timestamp() WHERE id = 1"),
    )
    lags: dict[str, list[float]] = {"native": [], "ours": []}
    samplers = [lag_sampler(b.native, lags["native"]), lag_sampler(b.sub, lags["ours"])]
    try:
        b.extra["live_load_tps"] = pgbench_load(b, "--rate", str(tps), "-T", str(seconds))
    finally:
        for ticker in (*samplers, beat):
            ticker.stop()
    return lags, drain(b, agents)


def drain(b: Bench, agents: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    """Seconds from now (the end of the load) until each subscriber shows a transaction committed now."""
    marker, t0 = mark(b), time.monotonic()
    out: dict[str, float] = {}
    deadline = time.monotonic() + 1800
    while len(out) < 2:
        for name, conninfo in (("native", b.native), ("ours", b.sub)):
            if name not in out and heartbeat_seq(conninfo) >= marker:
                out[name] = time.monotonic() - t0
        if any(proc.poll() is not None for proc in agents):
            raise BenchFailure(f"an agent of phase 3 ended early; see {b.root / 'agents.log'}")
        if time.monotonic() > deadline:
            raise BenchFailure("live lag: the subscribers did not catch up within 30 minutes of the load's end")
        time.sleep(POLL_SECONDS)
    return out


def add_lag_rows(
    b: Bench, tps: int, seconds: int, lags: dict[str, list[float]], drained: dict[str, float], peak: float
) -> None:
    label = f"live lag at {tps:,} pgbench tps (achieved {b.extra['live_load_tps']:,.0f}) for {seconds} s"
    for p in (50, 95):
        b.rows.append(row(f"{label}: p{p}", percentile(lags["native"], p), percentile(lags["ours"], p), "s"))
    b.rows.append(row(f"{label}: max", max(lags["native"], default=None), max(lags["ours"], default=None), "s"))
    b.rows.append(
        row("catch-up after the load stops (last transaction applied)", drained["native"], drained["ours"], "s")
    )
    b.rows.append(row("peak RSS, agents of phase 3 (log reader + distribution)", None, peak, "MiB", compare=False))
    b.extra["lag_samples"] = {k: len(v) for k, v in lags.items()}
    b.extra["agent_loop"] = agent_loop_mode()


def phase_sustained(b: Bench, window: int, steps: list[int]) -> None:
    """Step 4: each system alone against pgbench at each rate of ``steps`` for ``window`` seconds,
    until one is not held; rows: the highest rate held by each, and the CPU by role at it."""
    results: dict[str, dict[str, Any]] = {}
    execute(b.native, "ALTER SUBSCRIPTION native_sub ENABLE")  # a catch-up phase may leave it either way
    drain_native(b)
    results["native"] = sustained_steps(b, "native", window, steps, [])
    execute(b.native, "ALTER SUBSCRIPTION native_sub DISABLE")  # ours alone: its slot keeps the WAL meanwhile
    agents = start_agents(b)
    try:
        drain_ours(b, agents)
        results["ours"] = sustained_steps(b, "ours", window, steps, agents)
        execute(b.native, "ALTER SUBSCRIPTION native_sub ENABLE")
        drain(b, agents)  # both subscribers show one last transaction before the agents stop
    finally:
        stop_agents(b, agents)
    add_sustained_rows(b, window, results)
    check_checksums(b, "sustained throughput")


def drain_native(b: Bench) -> None:
    marker = mark(b)
    wait_for(lambda: heartbeat_seq(b.native) >= marker, "native catch-up", 3600)


def drain_ours(b: Bench, agents: list[subprocess.Popen[bytes]]) -> None:
    marker = mark(b)
    wait_for(lambda: running(b, agents) and heartbeat_seq(b.sub) >= marker, "our catch-up", 3600)


def sustained_steps(
    b: Bench, system: str, window: int, steps: list[int], agents: list[subprocess.Popen[bytes]]
) -> dict[str, Any]:
    """The steps against one ``system`` (its subscriber live; ``agents``: ours, to count their
    CPU): each rate for ``window`` s, then a drain, until a rate is not held.  Returns every
    step's verdict and the highest rate held with its CPU by role."""
    import psutil

    conninfo = b.native if system == "native" else b.sub
    out: dict[str, Any] = {"steps": [], "rate": None, "cpu": None}
    for rate in steps:
        procs = [psutil.Process(a.pid) for a in agents]
        before = [sum(p.cpu_times()[:2]) for p in procs]
        cpu = b.cpu_by_role()
        beat = Ticker(
            b.pub,
            HEARTBEAT_SECONDS,
            lambda c: c.execute("UPDATE public.bench_heartbeat SET seq = seq + 1, at = clock_timestamp() WHERE id = 1"),
        )
        lags: list[float] = []
        sampler = lag_sampler(conninfo, lags)
        try:
            achieved = pgbench_load(b, "--rate", str(rate), "-T", str(window))
        finally:
            sampler.stop()
            beat.stop()
        servers = cpu.stop()
        agent_cpu = [round(sum(p.cpu_times()[:2]) - t, 3) for p, t in zip(procs, before, strict=True)]
        ok, why = held(lags, rate, achieved)
        p95 = percentile(lags, 95)
        step = {"rate": rate, "achieved_tps": round(achieved, 1), "held": ok, "why": why, "lag_p95": p95}
        out["steps"].append(step)
        print(f"[sustained, {system}] {rate} tps: {'held' if ok else 'not held'} ({why})", flush=True)
        if agents:
            drain_ours(b, agents)
        else:
            drain_native(b)
        if not ok:
            break
        out["rate"], out["achieved"] = rate, achieved
        out["cpu"] = {"servers": servers, "agents": dict(zip(CONTINUOUS_AGENTS, agent_cpu, strict=False))}
    return out


def add_sustained_rows(b: Bench, window: int, results: dict[str, dict[str, Any]]) -> None:
    """The highest rate each system held, and the CPU seconds by role (per second of the window)
    at that rate."""
    native, ours = results["native"], results["ours"]
    label = f"highest sustained pgbench rate (held {window} s, lag p95 < {SUSTAINED_P95:g} s and not growing)"
    b.rows.append(row(label, native["rate"], ours["rate"], "tps"))
    b.extra["sustained"] = {"window_seconds": window, **results}

    def role(result: dict[str, Any], cluster: str, name: str) -> float | None:
        if result["cpu"] is None:
            return None
        return float(result["cpu"]["servers"].get(cluster, {}).get(name, 0.0)) / window

    def every(result: dict[str, Any], clusters: Sequence[str], leave_out: Sequence[str] = ()) -> float | None:
        if result["cpu"] is None:
            return None
        servers = result["cpu"]["servers"]
        total = sum(v for c in clusters for k, v in servers.get(c, {}).items() if k not in leave_out)
        return float(total + sum(result["cpu"]["agents"].values())) / window

    at = f"CPU seconds per second at the highest sustained rate (native {native['rate']}, ours {ours['rate']} tps)"
    b.rows += [
        row(
            f"{at}: the publisher's walsender",
            role(native, "publisher", "walsender"),
            role(ours, "publisher", "walsender"),
            "s",
        ),
        row(
            f"{at}: applying at the subscriber (native: its apply worker; ours: the subscriber's backend)",
            role(native, "native", "apply worker"),
            role(ours, "subscriber", "backend bench_sub"),
            "s",
        ),
        row(
            f"{at}: the publisher's pgbench backends",
            role(native, "publisher", "backend bench_pub"),
            role(ours, "publisher", "backend bench_pub"),
            "s",
        ),
        row(f"{at}: our distribution database", None, role(ours, "publisher", "backend bench_dist"), "s", False),
    ]
    for agent in CONTINUOUS_AGENTS:
        value = ours["cpu"]["agents"].get(agent, 0.0) / window if ours["cpu"] else None
        b.rows.append(row(f"{at}: our {agent} process", None, value, "s", False))
    b.rows.append(
        row(
            f"{at}: every process (servers, agents; the benchmark's polling left out)",
            every(native, ("publisher", "native"), ("backend bench_native", ENDED)),
            every(ours, ("publisher", "subscriber"), (ENDED,)),
            "s",
        )
    )


def agent_loop_mode() -> str:
    if continuous_supported():
        return f"continuous (log reader and distribution side by side, --poll-interval {CONTINUOUS_POLL})"
    return "loop of one-shot runs (log reader, then distribution)"


def continuous_supported() -> bool:
    import inspect

    from airflow_repl.engine.agents import distribution_agent, log_reader_agent

    return all(
        "continuous" in inspect.signature(f).parameters
        for f in (log_reader_agent.run_log_reader, distribution_agent.run_distribution)
    )


def agent_loop(topology_file: str, stop_file: str) -> int:
    """Child process of phase 3: Log Reader then Distribution, over and over, until the stop file exists."""
    from airflow_repl.hooks.connections import load_topology
    from airflow_repl.jobs.agent_job import run_agent

    topo = load_topology(topology_file)
    rounds = 0
    while not Path(stop_file).exists():
        read = run_agent("logreader", topo, "bench")
        delivered = run_agent("distribution", topo, "bench")
        rounds += 1
        if not read.get("commands") and not delivered.get("commands"):
            time.sleep(POLL_SECONDS)  # idle: do not spin on the servers
    print(json.dumps({"rounds": rounds}), flush=True)
    return 0


# ---------------------------------------------------------------------------- main
#: The phases, in the order they run (``--phases``).
PHASES = ("initial", "catch-up", "side-by-side", "live-lag", "sustained")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scale", type=int, default=10, help="pgbench -i scale of the initial sync (default 10)")
    parser.add_argument(
        "--transactions", type=int, default=100_000, help="pgbench backlog to catch up (default 100000)"
    )
    parser.add_argument("--tps", type=int, default=1000, help="pgbench --rate of the live-lag phase (default 1000)")
    parser.add_argument("--lag-seconds", type=int, default=30, help="length of the live-lag phase (default 30)")
    parser.add_argument("--json", default=DEFAULT_JSON, help=f"where to write the results (default {DEFAULT_JSON})")
    parser.add_argument(
        "--apply-mode",
        choices=("auto", "per_command", "net_change"),
        help="give our subscription this apply_mode (default: none, so the default: auto)",
    )
    parser.add_argument("--bulk-apply", action="store_true", help="the same as --apply-mode net_change")
    parser.add_argument(
        "--sustained-window", type=int, default=60, help="seconds each rate of the sustained phase runs (default 60)"
    )
    parser.add_argument(
        "--sustained-start", type=int, default=500, help="first pgbench rate of the sustained phase (default 500)"
    )
    parser.add_argument(
        "--sustained-step", type=int, default=500, help="the rate's step in the sustained phase (default 500)"
    )
    parser.add_argument(
        "--sustained-max", type=int, default=10_000, help="last rate tried in the sustained phase (default 10000)"
    )
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated phases to run, of {', '.join(PHASES)} (default all; the initial sync always runs: "
        "the others start from it)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the sandbox (printed) instead of destroying it")
    parser.add_argument("--agent-loop", help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in (
        "scale",
        "transactions",
        "tps",
        "lag_seconds",
        "sustained_window",
        "sustained_start",
        "sustained_step",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        parser.error(f"--phases: unknown phase {unknown[0]!r}; the phases are {', '.join(PHASES)}")
    args.phases = {"initial", *phases}
    if args.bulk_apply:
        if args.apply_mode not in (None, "net_change"):
            parser.error("--bulk-apply means --apply-mode net_change: give one of them")
        args.apply_mode = "net_change"
    if args.sustained_max < args.sustained_start:
        parser.error("--sustained-max must be at least --sustained-start")
    return args


def run_info(args: argparse.Namespace, b: Bench) -> dict[str, Any]:
    import psutil

    version = b.pg_tool("pgbench", ["--version"], b.pub).strip() if hasattr(b, "pub") else None
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "host": platform.node(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "postgresql": version,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "args": {
            **{
                k: getattr(args, k)
                for k in ("scale", "transactions", "tps", "lag_seconds", "apply_mode", "sustained_window")
            },
            "phases": [p for p in PHASES if p in args.phases],
        },
        **b.extra,
    }


def report(args: argparse.Namespace, b: Bench) -> None:
    print(format_table(b.rows), flush=True)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(results_json(b.rows, run_info(args, b)) + "\n")
    print(f"results written to {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.agent_loop:
        return agent_loop(args.agent_loop, args.stop_file)
    b = Bench(tempfile.mkdtemp(prefix="airflow-repl-native-"))
    status = 0
    try:
        b.extra["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
        b.start({"apply_mode": args.apply_mode} if args.apply_mode else {})
        setup(b, args.scale)
        options = f"apply_mode: {args.apply_mode}" if args.apply_mode else "defaults (apply_mode: auto)"
        print(
            f"setup done: scale {args.scale}, apply {b.extra['apply_seconds']} s; our subscription: {options}",
            flush=True,
        )
        phase_initial(b)
        if "catch-up" in args.phases:
            phase_catchup(b, args.transactions)
        if "side-by-side" in args.phases and continuous_supported():
            phase_catchup_side_by_side(b, args.transactions)
        if "live-lag" in args.phases:
            phase_lag(b, args.tps, args.lag_seconds)
        if "sustained" in args.phases and continuous_supported():
            steps = rates(args.sustained_start, args.sustained_step, args.sustained_max)
            phase_sustained(b, args.sustained_window, steps)
    except BenchFailure as exc:
        print(f"native_compare: error: {exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        report(args, b)
        if args.keep:
            print(f"sandbox kept in {b.root}", flush=True)
        else:
            b.sb.destroy()
            shutil.rmtree(b.root, ignore_errors=True)  # the snapshot folder, the topology file, the logs
    return status


if __name__ == "__main__":
    sys.exit(main())
