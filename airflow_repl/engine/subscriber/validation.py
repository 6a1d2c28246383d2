"""Validation: which rows of every article differ between the publisher and a subscriber.

Validation compares *values*, not bytes or orderings.  Each row is turned into its PostgreSQL
text form (the session settings of :mod:`connections` pin everything that text depends on),
converted to UTF8 whatever the database's encoding, and hashed; a set of rows' checksum is the
sum of its rows' hashes, which does not depend on the order rows are visited in.

**Key ranges.**  The key space of an article is split into ``ranges`` ranges of the 32-bit hash
of each key's UTF8 text (range ``i`` holds the keys whose hash ``h`` has ``h * ranges >> 32 ==
i``).  Unlike ranges of the keys' own order, a hash range holds the same keys at every server,
whatever its collation and encoding.  Validation runs in two passes of independent tasks, which
the caller maps over Spark executors (:mod:`airflow_repl.jobs.agent_job`) or runs in turn:

1. **sums**: per article and side (the publisher, each subscriber), each range's row count and
   hash sums, in one task per block range of the table (:func:`block_chunks`: one for a table
   up to ``BLOCKS_PER_TASK`` blocks); the publisher's side reads only the rows passing the
   article's row filter, and both sides only the article's columns (its column filter);
2. **rows**: per article and subscriber whose sums differ in some ranges, the rows of those
   ranges only, read from both servers in the same (byte) order of their keys' UTF8 text and
   merged: a key only at the publisher is *missing*, only at the subscriber *extra*, at both
   with other values *different*.  Both sides stream through server-side cursors, so memory
   stays constant however many rows differ; the first ``max_keys`` keys are kept, the counts
   are complete.

**One snapshot per server.**  Each server's side is read in one snapshot, exported at the start
by a read-only repeatable-read transaction held open until the end (``pg_export_snapshot``) and
taken by every task (``SET TRANSACTION SNAPSHOT``): the block ranges of pass 1 add up to one
consistent table, and pass 2 reads the very rows pass 1 summed, even while the server is written.

**One plan for every kind of subscriber.**  The ranges, the tasks' planning, the sums' addition
and the merge are :func:`_validate_route`'s; a :class:`Route` says only how a kind of subscriber
is read: PostgreSQL's (:data:`POSTGRES`) in SQL as above, a MariaDB subscriber's
(:data:`~airflow_repl.engine.subscriber.mariadb_validation.ROUTE`) by canonical values hashed in
the tasks (:func:`key_range`, :func:`add_row`).

The pure parts (:func:`merge_rows`, :func:`differing_ranges`, :func:`format_report`) need no
server; the tasks (:func:`range_sums`, :func:`range_rows`) run on executors and take plain data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine import errors
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import ConnectionLost, NotInitialized, ReplError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import catalog, connections, raw_sql
from airflow_repl.engine.state import dist_publications

#: Ranges of the key-hash space per article (a power of two is not required).
RANGES = 1024
#: The most ranges per article (pass 1 returns a line per non-empty range and server).
MAX_RANGES = 65536
#: Differing keys listed per article and subscriber (the counts are always complete).
MAX_KEYS = 10
#: Table blocks (8 kB each by default) one pass-1 task scans: a larger table's scan is split into
#: block ranges (``ctid`` ranges, read by TID range scans), one Spark task each; sums add up.
BLOCKS_PER_TASK = 16384
#: The most pass-1 tasks per article and server.
MAX_CHUNKS = 64
#: Rows fetched at a time by the row pass.
FETCH_ROWS = 5000
#: The three kinds of difference, as reported.
MISSING, EXTRA, DIFFERENT = "missing at the subscriber", "extra at the subscriber", "values differ"

#: A task of either pass (plain data: it is shipped to Spark executors).
Task = dict[str, Any]
#: Runs a task function over tasks (on Spark executors, or in turn) and returns the results in order.
MapTasks = Callable[[Callable[[Task], Any], list[Task]], list[Any]]
#: Per range index: [row count, hash sum 1, hash sum 2].
Sums = dict[int, list[int]]


def run_locally(f: Callable[[Task], Any], tasks: list[Task]) -> list[Any]:
    """:data:`MapTasks` without Spark: the tasks in turn, in this process."""
    return [f(t) for t in tasks]


# ---------------------------------------------------------------------- SQL pieces
def _utf8(expr: sql.Composable) -> sql.Composable:
    return sql.SQL("convert_to({}::text, 'UTF8')").format(expr)


def _row(columns: list[str]) -> sql.Composable:
    return sql.SQL("ROW({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in columns))


def _range_of(key: list[str], ranges: int) -> sql.Composable:
    """The range index of a row's key: the first 32 bits of its UTF8 text's md5, scaled."""
    h = sql.SQL("('x' || lpad(left(md5({}), 8), 16, '0'))::bit(64)::bigint").format(_utf8(_row(key)))
    return sql.SQL("(({} * {}) >> 32)::int").format(h, sql.Literal(ranges))


def key_range(key: bytes, ranges: int) -> int:
    """:func:`_range_of` in Python, for sides whose keys are hashed off the server (a MariaDB
    subscriber's canonical keys): the first 32 bits of the key bytes' md5, scaled."""
    return (int.from_bytes(hashlib.md5(key).digest()[:4], "big") * ranges) >> 32


def add_row(sums: Sums, index: int, digest: bytes) -> None:
    """Count a row of range ``index`` whose hash is ``digest`` (16 bytes) into ``sums``: its two
    halves as signed 64-bit numbers, as :func:`_sums_query` adds them."""
    entry = sums.setdefault(index, [0, 0, 0])
    entry[0] += 1
    entry[1] += int.from_bytes(digest[:8], "big", signed=True)
    entry[2] += int.from_bytes(digest[8:], "big", signed=True)


def _side(art: ResolvedArticle, publisher: bool) -> tuple[sql.Composable, sql.Composable]:
    """(relation, row condition) of the article at the publisher (its row filter) or a subscriber."""
    if publisher:
        cond = sql.SQL("({})").format(sql.SQL(art.row_filter)) if art.row_filter else sql.SQL("true")
        return art.source, cond
    return sql.Identifier(art.dest_schema, art.dest_table), sql.SQL("true")


def block_condition(chunk: list[int | None]) -> sql.Composable:
    """The condition of a block range [lower, upper) (None: unbounded) on the rows' ``ctid``."""
    parts = [
        sql.SQL("ctid {} {}::tid").format(sql.SQL(op), sql.Literal(f"({bound},0)"))
        for op, bound in ((">=", chunk[0]), ("<", chunk[1]))
        if bound is not None
    ]
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")


def _sums_query(art: ResolvedArticle, publisher: bool, ranges: int, chunk: list[int | None]) -> sql.Composable:
    relation, cond = _side(art, publisher)
    cond = sql.SQL("{} AND {}").format(cond, block_condition(chunk))
    half = "coalesce(sum(('x' || substr(d, {at}, 16))::bit(64)::bigint), 0)"  # summed exactly, in 128 bits
    return sql.SQL(
        "SELECT r, count(*), {s} FROM (SELECT {r} AS r, md5({row}) AS d FROM {t} WHERE {c}) x GROUP BY r"
    ).format(
        s=sql.SQL(", ").join(sql.SQL(half).format(at=sql.Literal(at)) for at in (1, 17)),
        r=_range_of(art.primary_key, ranges),
        row=_utf8(_row(art.column_names)),
        t=relation,
        c=cond,
    )


def _rows_query(art: ResolvedArticle, publisher: bool, ranges: int, bad: list[int]) -> sql.Composed:
    relation, cond = _side(art, publisher)
    return sql.SQL(
        "SELECT {kb}, {key}::text, md5({row}) FROM {t} WHERE {c} AND {r} = ANY({bad}::int[]) ORDER BY 1"
    ).format(
        kb=_utf8(_row(art.primary_key)),
        key=_row(art.primary_key),
        row=_utf8(_row(art.column_names)),
        t=relation,
        c=cond,
        r=_range_of(art.primary_key, ranges),
        bad=sql.Literal(bad),
    )


# ---------------------------------------------------------------------- the tasks (executor side)
def range_sums(task: Task) -> Sums:
    """Pass 1, one article at one server: every non-empty range's row count and hash sums."""
    art = ResolvedArticle.from_dict(task["article"])
    with connections.connect(task["conninfo"], task["role"]) as conn:
        use_snapshot(conn, task.get("snapshot"))
        rows = raw_sql.execute(conn, _sums_query(art, task["publisher"], task["ranges"], task["chunk"])).fetchall()
    return {int(r): [int(n), int(s1), int(s2)] for r, n, s1, s2 in rows}


def _open(cur: psycopg.ServerCursor, query: sql.Composed) -> list[tuple[bytes, str, str]]:
    """Run ``query`` in ``cur`` and fetch its first rows (the server scans and sorts meanwhile)."""
    cur.execute(query)
    return cur.fetchmany(FETCH_ROWS)


def _stream(cur: psycopg.ServerCursor, first: list[tuple[bytes, str, str]]) -> Iterator[tuple[bytes, str, str]]:
    batch = first
    while batch:
        yield from batch
        batch = cur.fetchmany(FETCH_ROWS)


def range_rows(task: Task) -> dict[str, Any]:
    """Pass 2, one article and subscriber: the rows of the differing ranges of both servers,
    merged by key (see :func:`merge_rows`).  Both servers scan and sort at the same time."""
    art = ResolvedArticle.from_dict(task["article"])
    with (
        connections.connect(task["publisher"], "publisher") as pub,
        connections.connect(task["subscriber"], f"subscriber {task['name']!r}") as sub,
    ):
        use_snapshot(pub, task.get("publisher_snapshot"))
        use_snapshot(sub, task.get("subscriber_snapshot"))
        return _merge_ranges(art, task, pub, sub)


def _merge_ranges(
    art: ResolvedArticle, task: Task, pub: psycopg.Connection[Any], sub: psycopg.Connection[Any]
) -> dict[str, Any]:
    ranges, bad = task["ranges"], task["bad"]
    with (
        pub.cursor(name="airflow_repl_validate") as p_cur,
        sub.cursor(name="airflow_repl_validate") as s_cur,
        ThreadPoolExecutor(2) as pool,
    ):
        p_first = pool.submit(_open, p_cur, _rows_query(art, True, ranges, bad))
        s_first = pool.submit(_open, s_cur, _rows_query(art, False, ranges, bad))
        return merge_rows(_stream(p_cur, p_first.result()), _stream(s_cur, s_first.result()), task["max_keys"])


def use_snapshot(conn: psycopg.Connection[Any], snapshot: str | None) -> None:
    """Start ``conn``'s transaction in the exported ``snapshot`` (None: a snapshot of its own)."""
    if snapshot is None:
        return
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))


@contextmanager
def exported_snapshots(sides: list[tuple[str, str]], failed: _Failed | None = None) -> Iterator[dict[str, str]]:
    """side -> the id of a snapshot of that server, exported by a read-only repeatable-read
    transaction that stays open until the block ends (tasks may take it meanwhile); a side whose
    export fails is left out and given to ``failed`` (raised without it)."""
    with ExitStack() as stack:
        ids: dict[str, str] = {}
        for side, conninfo in sides:
            with _Failed(None).of(side) if failed is None else failed.of(side):
                conn = stack.enter_context(
                    connections.connect(conninfo, f"subscriber {side!r}" if side else "publisher")
                )
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                conn.read_only = True
                row = conn.execute("SELECT pg_export_snapshot()").fetchone()
                assert row is not None
                ids[side] = str(row[0])
        yield ids


# ---------------------------------------------------------------------- the pure parts
def merge_rows(
    pub: Iterable[tuple[bytes, str, str]], sub: Iterable[tuple[bytes, str, str]], max_keys: int
) -> dict[str, Any]:
    """Merge two streams of (key bytes, key text, row hash), each in ascending key-byte order:
    the count of each kind of difference and the first ``max_keys`` differing keys."""
    counts = {MISSING: 0, EXTRA: 0, DIFFERENT: 0}
    keys: list[dict[str, str]] = []

    def found(key: str, kind: str) -> None:
        counts[kind] += 1
        if len(keys) < max_keys:
            keys.append({"key": key, "difference": kind})

    p_it, s_it = iter(pub), iter(sub)
    p, s = next(p_it, None), next(s_it, None)
    while p is not None or s is not None:
        if s is None or (p is not None and bytes(p[0]) < bytes(s[0])):
            found(p[1], MISSING)  # type: ignore[index]
            p = next(p_it, None)
        elif p is None or bytes(s[0]) < bytes(p[0]):
            found(s[1], EXTRA)
            s = next(s_it, None)
        else:
            if p[2] != s[2]:
                found(p[1], DIFFERENT)
            p, s = next(p_it, None), next(s_it, None)
    return {"missing": counts[MISSING], "extra": counts[EXTRA], "different": counts[DIFFERENT], "differences": keys}


def block_chunks(blocks: int, per_task: int = BLOCKS_PER_TASK, max_chunks: int = MAX_CHUNKS) -> list[list[int | None]]:
    """Block ranges [lower, upper) covering a table of ``blocks`` blocks, the first unbounded
    below and the last above: together they hold every row once, whatever the table's size
    when they are read (and every inheritance child's rows too)."""
    n = max(1, min(max_chunks, -(-blocks // per_task)))
    step = -(-blocks // n)
    bounds: list[int | None] = [None, *(i * step for i in range(1, n)), None]
    return [[bounds[i], bounds[i + 1]] for i in range(n)]


def add_sums(total: Sums, part: Sums) -> Sums:
    """Add a chunk's range sums into ``total`` (counts and hash sums are additive)."""
    for r, values in part.items():
        total[r] = [a + b for a, b in zip(total.get(r, [0, 0, 0]), values, strict=True)]
    return total


def differing_ranges(pub: Sums, sub: Sums) -> list[int]:
    """The ranges whose counts or sums differ (a range empty on one side differs if the other has rows)."""
    return sorted(r for r in pub.keys() | sub.keys() if pub.get(r) != sub.get(r))


def totals(sums: Sums) -> tuple[int, str]:
    """(rows, checksum) of a whole side from its ranges' sums."""
    count = sum(v[0] for v in sums.values())
    s1, s2 = sum(v[1] for v in sums.values()), sum(v[2] for v in sums.values())
    return count, hashlib.md5(f"{count}:{s1}:{s2}".encode()).hexdigest()


def article_row(name: str, pub: Sums, sub: Sums, ranges: int) -> dict[str, Any]:
    """One article's line of the report, before the row pass fills in its differences."""
    (p_rows, p_sum), (s_rows, s_sum) = totals(pub), totals(sub)
    bad = differing_ranges(pub, sub)
    return {
        "article": name,
        "publisher_rows": p_rows,
        "subscriber_rows": s_rows,
        "publisher_checksum": p_sum,
        "subscriber_checksum": s_sum,
        "match": not bad,
        "ranges": ranges,
        "differing_ranges": len(bad),
        "missing": 0,
        "extra": 0,
        "different": 0,
        "differences": [],
    }


# ---------------------------------------------------------------------- the driver
def validate(
    topology: Topology,
    publication: str,
    subscribers: list[str],
    map_tasks: MapTasks = run_locally,
    *,
    ranges: int = RANGES,
    max_keys: int = MAX_KEYS,
    articles: list[ResolvedArticle] | None = None,
    failures: dict[str, ReplError] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """subscriber -> one report line per article (see :func:`article_row`), with the counts of
    missing, extra and different rows and the first ``max_keys`` differing keys filled in.
    Bad input (undeployed publication, uninitialized subscriber) is refused before any task runs.
    ``failures``: a subscriber that cannot be validated (not initialized, unreachable, lost) is
    put there with its error and left out of the report while the others are validated (without
    it, its error is raised); the publisher's failure is raised in any case."""
    if not 1 <= ranges <= MAX_RANGES or max_keys < 0:
        raise ReplError(
            f"validation of publication {publication!r} needs ranges from 1 to {MAX_RANGES} and max_keys >= 0 "
            f"(got ranges {ranges} and max_keys {max_keys})"
        )
    if articles is None:
        with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
            articles = dist_publications.load_articles(dist, publication)
    limits = (ranges, max_keys)
    failed = _Failed(failures)
    mariadb = [n for n in subscribers if topology.is_mariadb_subscriber(n)]
    postgres = [n for n in subscribers if n not in mariadb]
    report: dict[str, list[dict[str, Any]]] = {}
    if mariadb:  # imported only for them: a PostgreSQL-only run never loads the MariaDB driver
        from airflow_repl.engine.subscriber import mariadb_validation

        report |= _validate_route(mariadb_validation.ROUTE, topology, mariadb, articles, failed, map_tasks, limits)
    if postgres:
        report |= _validate_route(POSTGRES, topology, postgres, articles, failed, map_tasks, limits)
    return {name: report[name] for name in subscribers if name in report}


@dataclass(frozen=True)
class Route:
    """How one kind of subscriber is validated; the planning and merging around it are
    :func:`_validate_route`'s, the same for every kind.

    ``chunks(conninfo, side, articles)``: article -> the chunks pass 1 reads it in at the
    publisher (side "") or at subscriber ``side`` (its tables checked: NotInitialized without
    one); ``sums``/``rows``: the tasks of pass 1 and 2; ``snapshots``: whether the subscribers
    export a snapshot that every task takes (PostgreSQL), or each task reads in its own."""

    chunks: Callable[[str, str, list[ResolvedArticle]], dict[str, list[list[int | None]]]]
    sums: Callable[[Task], Sums]
    rows: Callable[[Task], dict[str, Any]]
    snapshots: bool


def _validate_route(
    route: Route,
    topology: Topology,
    subscribers: list[str],
    articles: list[ResolvedArticle],
    failed: _Failed,
    map_tasks: MapTasks,
    limits: tuple[int, int],
) -> dict[str, list[dict[str, Any]]]:
    """:func:`validate` of subscribers of one kind: key-hash ranges summed in Spark tasks, then
    the rows of the differing ranges."""
    ranges, max_keys = limits
    pub_ci = topology.publisher.require("publisher")
    chunks = {"": route.chunks(pub_ci, "", articles)}
    for name in subscribers:  # checks the tables exist
        with failed.of(name):
            chunks[name] = route.chunks(topology.subscriber_conninfo(name), name, articles)
    subs = {name: topology.subscriber_conninfo(name) for name in subscribers if name in chunks}
    if not subs:  # none left to compare (each one's error is in failures)
        return {}
    exporting = [("", pub_ci), *(subs.items() if route.snapshots else ())]
    with exported_snapshots(exporting, failed) as snapshots:
        sides = [("", pub_ci), *((name, ci) for name, ci in subs.items() if name in snapshots or not route.snapshots)]
        tasks = [
            {**_sums_task(art, side, ci, ranges, chunk), "snapshot": snapshots.get(side)}
            for side, ci in sides
            for art in articles
            for chunk in chunks[side][art.name]
        ]
        sums: dict[tuple[str, str], Sums] = {(side, a.name): {} for side, _ in sides for a in articles}
        for task, part in zip(tasks, failed.mapped(map_tasks, route.sums, tasks), strict=True):
            if failed.took(task["side"], part):
                add_sums(sums[task["side"], task["name"]], part["result"])
        report = {
            name: [article_row(a.name, sums["", a.name], sums[name, a.name], ranges) for a in articles]
            for name, _ in sides[1:]
            if name not in failed.errors
        }
        _fill_differences(
            route, report, articles, sums, (pub_ci, subs), snapshots, (ranges, max_keys), map_tasks, failed
        )
    return {name: rows for name, rows in report.items() if name not in failed.errors}


class _Failed:
    """The subscribers that could not be validated, each with its error (raised at once when the
    caller collects none, or when the side is the publisher's)."""

    def __init__(self, collected: dict[str, ReplError] | None) -> None:
        self.collected = collected
        self.errors: dict[str, ReplError] = collected if collected is not None else {}

    def add(self, side: str, error: ReplError) -> None:
        if not side or self.collected is None:
            raise error
        self.errors.setdefault(side, error)

    @contextmanager
    def of(self, side: str) -> Iterator[None]:
        """Errors of the block are ``side``'s."""
        try:
            yield
        except (ReplError, psycopg.Error) as exc:
            self.add(side, as_error(exc, f"subscriber {side!r}" if side else "publisher"))

    def mapped(self, map_tasks: MapTasks, f: Callable[[Task], Any], tasks: list[Task]) -> list[dict[str, Any]]:
        """``f`` over ``tasks``, each task's error returned as data (:func:`task_outcome`): a task
        that raises would abort every other on Spark."""
        return map_tasks(lambda task: task_outcome(f, task), tasks) if tasks else []

    def took(self, side: str, outcome: dict[str, Any]) -> bool:
        """Whether a task of ``side`` succeeded (its error recorded otherwise)."""
        if "error" in outcome:
            cls = getattr(errors, outcome["error"], ReplError)
            self.add(side, cls(outcome["message"]))
        return "error" not in outcome and side not in self.errors


def as_error(exc: BaseException, role: str) -> ReplError:
    """An error of validation at a server as the engine's own: a lost connection is
    ConnectionLost (retryable); an engine error stays itself."""
    if isinstance(exc, ReplError):
        return exc
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return ConnectionLost(f"lost connection to the {role} during validation ({first}); run it again")
    return ReplError(f"validation at the {role} failed: {first}")


def task_outcome(f: Callable[[Task], Any], task: Task) -> dict[str, Any]:
    """Executor side: ``{"result": f(task)}``, or the error it raised as ``error`` (its class's
    name) and ``message``."""
    try:
        return {"result": f(task)}
    except (ReplError, psycopg.Error) as exc:
        error = as_error(exc, task.get("role") or f"subscriber {task['name']!r}")
        return {"error": type(error).__name__, "message": str(error)}


def _sums_task(art: ResolvedArticle, side: str, conninfo: str, ranges: int, chunk: list[int | None]) -> Task:
    """Pass 1's task of one article's block range at the publisher (side "") or at subscriber ``side``."""
    role = f"subscriber {side!r}" if side else "publisher"
    return {
        "article": art.to_dict(),
        "name": art.name,
        "side": side,
        "conninfo": conninfo,
        "role": role,
        "publisher": not side,
        "ranges": ranges,
        "chunk": chunk,
    }


def _fill_differences(
    route: Route,
    report: dict[str, list[dict[str, Any]]],
    articles: list[ResolvedArticle],
    sums: dict[tuple[str, str], Sums],
    servers: tuple[str, dict[str, str]],
    snapshots: dict[str, str],
    limits: tuple[int, int],
    map_tasks: MapTasks,
    failed: _Failed,
) -> None:
    """Pass 2: the rows of the differing ranges of every article and subscriber that differ
    (``servers``: the publisher's and the subscribers' conninfos; ``limits``: ranges, max_keys),
    each side in its snapshot of pass 1."""
    (pub_ci, subs), (ranges, max_keys) = servers, limits
    targets: list[dict[str, Any]] = []
    tasks: list[Task] = []
    for name, rows in report.items():
        for art, row in zip(articles, rows, strict=True):
            if row["match"]:
                continue
            bad = differing_ranges(sums["", art.name], sums[name, art.name])
            targets.append(row)
            tasks.append(
                {
                    "article": art.to_dict(),
                    "publisher": pub_ci,
                    "subscriber": subs[name],
                    "name": name,
                    "ranges": ranges,
                    "bad": bad,
                    "max_keys": max_keys,
                    "publisher_snapshot": snapshots[""],
                    "subscriber_snapshot": snapshots.get(name),
                }
            )
    for row, task, found in zip(targets, tasks, failed.mapped(map_tasks, route.rows, tasks), strict=True):
        if failed.took(task["name"], found):
            row.update(found["result"])


def table_chunks(conninfo: str, side: str, articles: list[ResolvedArticle]) -> dict[str, list[list[int | None]]]:
    """article -> the block ranges pass 1 reads its table in (:func:`block_chunks`) at a
    PostgreSQL server: the publisher (side "") or subscriber ``side``."""
    return {
        name: block_chunks(blocks, BLOCKS_PER_TASK, MAX_CHUNKS)
        for name, blocks in _table_blocks(conninfo, side, articles).items()
    }


def _table_blocks(conninfo: str, side: str, articles: list[ResolvedArticle]) -> dict[str, int]:
    """article -> blocks of its table at the publisher (side "") or at subscriber ``side``; a
    subscriber without the destination table is not initialized."""
    role = f"subscriber {side!r}" if side else "publisher"
    out: dict[str, int] = {}
    with connections.connect(conninfo, role, autocommit=True) as conn:
        for art in articles:
            schema, table = (art.dest_schema, art.dest_table) if side else (art.table.schema, art.table.name)
            name = sql.Identifier(schema, table).as_string(conn)
            blocks = catalog.table_blocks(conn, name, art.include_children and not side)
            if blocks is None:
                where = (
                    f"subscriber {side!r} has no table {art.destination}"
                    if side
                    else f"the publisher has no table {schema}.{table}"
                )
                raise NotInitialized(
                    f"{where} for article {art.name!r} of publication {art.publication!r}: run the Snapshot Agent "
                    f"for it before validating"
                )
            out[art.name] = blocks
    return out


#: PostgreSQL subscribers: block ranges read in the servers' exported snapshots, sums and rows in SQL.
POSTGRES = Route(table_chunks, range_sums, range_rows, snapshots=True)


def compare(
    topology: Topology,
    publication: str,
    subscriber: str,
    articles: list[ResolvedArticle] | None = None,
    map_tasks: MapTasks = run_locally,
) -> list[dict[str, Any]]:
    """One subscriber's report lines (see :func:`validate`)."""
    return validate(topology, publication, [subscriber], map_tasks, articles=articles)[subscriber]


def matches(report: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether every article of every subscriber in ``report`` matches."""
    return all(r["match"] for rows in report.values() for r in rows)


def differences_line(publication: str, report: dict[str, list[dict[str, Any]]]) -> str:
    """One line naming what differs: each subscriber/article and its counts of each kind."""
    parts = [
        f"{name}/{r['article']} ({r['missing']} missing, {r['extra']} extra, {r['different']} different)"
        for name, rows in report.items()
        for r in rows
        if not r["match"]
    ]
    return f"validation of publication {publication!r} found differences at {'; '.join(parts)}"


def format_report(rows: list[dict[str, Any]]) -> str:
    """One subscriber's report as text: a line per article, then its differing keys listed."""
    lines = [f"{'article':<24} {'pub rows':>10} {'sub rows':>10} {'missing':>8} {'extra':>8} {'different':>9}  match"]
    for r in rows:
        lines.append(
            f"{r['article']:<24} {r['publisher_rows']:>10} {r['subscriber_rows']:>10} {r.get('missing', 0):>8} "
            f"{r.get('extra', 0):>8} {r.get('different', 0):>9}  {'yes' if r['match'] else 'NO'}"
        )
        listed = r.get("differences", [])
        lines += [f"    key {d['key']}: {d['difference']}" for d in listed]
        more = r.get("missing", 0) + r.get("extra", 0) + r.get("different", 0) - len(listed)
        if more > 0:
            lines.append(f"    ... and {more} more key(s) (raise --max-keys to list them)")
    return "\n".join(lines)
