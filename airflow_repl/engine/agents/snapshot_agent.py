"""The Snapshot Agent: a consistent initial copy of a publication, and initializing
subscriptions from it.

Consistency without blocking writers: the publication's logical slot is created with an
exported snapshot (a temporary slot when the publication's slot already exists).  Every reader,
on every Spark executor, joins that snapshot with ``SET TRANSACTION SNAPSHOT``, so all
partitions see the database exactly as of the slot's consistent point.  Transactions that
commit at or after that point are exactly the ones the slot decodes, so the subscription's
watermark starts just before it: rows written during the snapshot are neither lost nor doubled.

A run, step by step: check the subscriptions and apply the topology; create the slot; plan
block ranges in the exported snapshot; write the folder's scripts and prepare each subscription
that needs initializing (types, schema and procedures, 'initializing'); read the ranges with
Spark, each task writing its Parquet file and loading the same rows into those subscribers as it
reads them (one pass over the data, the publisher's read and the subscribers' COPY overlapping);
write the manifest; activate each subscription (keys, row check, watermark, 'active').

Owns the order of those steps and the checks that refuse a subscription before anything of it
changes.  The folder's files and their read and load are
:mod:`~airflow_repl.engine.agents.snapshot_folder`'s; the slot's statements are
:mod:`~airflow_repl.engine.postgres.slots`'; the state tables' are
the distribution database modules' (``state.dist_*``) and ``subscriber_state``'s; the run's lifecycle is
:class:`~airflow_repl.engine.runtime.lifecycle.AgentRun`'s.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from psycopg import sql

from airflow_repl.engine.agents import snapshot_folder
from airflow_repl.engine.agents.snapshot_folder import DataFile, LoadTarget, Partition
from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.codegen import call_syntax, immediate_triggers, queue_triggers, updating_scripts, user_types
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.propagation import Operation
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections, slots, trigger_switching
from airflow_repl.engine.provisioning import deploy
from airflow_repl.engine.runtime import progress_lines, subscriber_writer
from airflow_repl.engine.runtime.lifecycle import AgentRun
from airflow_repl.engine.state import (
    dist_publications,
    dist_subscription_articles,
    dist_subscriptions,
    subscriber_immediate,
    subscriber_state,
)
from airflow_repl.engine.subscriber import in_doubt

if TYPE_CHECKING:  # MariaDB subscribers' modules: imported by the steps of such a subscriber
    from airflow_repl.engine.agents import mariadb_snapshot

AGENT = "snapshot"

#: (subscriber, conninfo) -> a connection, in a ``with`` block
Connect = Callable[[str, str], "AbstractContextManager[psycopg.Connection[Any]]"]
#: Executor side: names the Spark executor running the current task (given by airflow_repl.jobs,
#: which may import PySpark); the summary lists the executors that read and loaded the files.
Identify = Callable[[], str]


# ---------------------------------------------------------------------- what the agent uses of Spark
class RDD(Protocol):
    def map(self, f: Callable[[Any], Any]) -> RDD: ...
    def collect(self) -> list[Any]: ...


class SparkContext(Protocol):
    @property
    def defaultParallelism(self) -> int: ...
    def parallelize(self, c: Iterable[Any], numSlices: int | None = None) -> RDD: ...
    def accumulator(self, value: int) -> Any: ...


class SparkSession(Protocol):
    """What the agent uses of a ``pyspark.sql.SparkSession`` (the engine never imports PySpark)."""

    @property
    def sparkContext(self) -> SparkContext: ...


# ---------------------------------------------------------------------- the agent
def run_snapshot(
    topology: Topology,
    publication: str,
    spark: SparkSession,
    *,
    subscribers: list[str] | None = None,
    reinitialize: bool = False,
    article: str | None = None,
    max_partitions: int | None = None,
    identify: Identify | None = None,
    import_ahead: bool = False,
) -> dict[str, Any]:
    """Snapshot ``publication`` and initialize its subscriptions that need it (all named ones
    with ``reinitialize``), and copy to each active one, on its own, every article it does not
    hold yet (an article added to the live publication; ``article`` with ``reinitialize``: that
    article again).  Returns a summary; with ``identify``, it names the executors that
    read the partitions (``read_executors``) and loaded the files (``load_executors``).
    ``import_ahead``: the tasks run in threads of this process (``spark`` starts no JVM whose
    start the data files' modules are imported during), so they are imported in a thread of
    their own once the run knows it copies
    (:class:`~airflow_repl.engine.agents.snapshot_folder.FileModulesImport`)."""
    names = _named_subscribers(topology, publication, subscribers)
    check_article(topology, publication, article, reinitialize)
    snapshot_folder.check_writable(Path(topology.snapshot_folder) / publication)
    with AgentRun(AGENT, publication) as run:
        snap = _SnapshotRun(run, topology, publication, import_ahead)
        run.lock(snap.dist)
        articles, targets, copies = snap.plan_subscriptions(names, reinitialize, article)
        run.begin(snap.dist)
        has_slot = snap.check_slot(targets)
        if has_slot and not targets and copies:
            result = _copy_articles(snap, articles, copies, spark, max_partitions, identify)
            return run.succeed(result, message=result["message"], rows_copied=result["rows"])
        if has_slot and not targets:
            message = "every subscription is already initialized; nothing to do"
            nothing: dict[str, Any] = {
                "snapshot_id": None,
                "initialized": [],
                "rows": 0,
                "tables": {},
                "message": message,
            }
            return run.succeed(nothing, message=message)
        snap.check_subscriber_types(articles, targets)
        in_doubt.resolve_quietly(topology, publication, list(targets))  # their changes reach the snapshot
        init = _Initialization(topology, publication, articles, targets, snap.dist, run)
        turns = init.take_turns()  # before the slot's consistent point, until they are active
        try:
            taken = snap.take(articles, has_slot, spark, max_partitions, identify, init)
            manifest = snap.write_folder(articles, taken)
            loaded = init.activate_all(manifest, taken.files)
        finally:
            for turn in turns:
                turn.give_back()
        summary = {**taken.summary(targets, loaded), "tables": _table_rows(articles, taken.files)}
        rows = taken.rows
        if copies:  # the subscriptions already active get their new articles on their own
            copied = _copy_articles(snap, articles, copies, spark, max_partitions, identify)
            summary["articles_copied"], rows = copied["articles_copied"], rows + copied["rows"]
        return run.succeed(summary, rows_copied=rows)


def check_article(topology: Topology, publication: str, article: str | None, reinitialize: bool) -> None:
    """``article`` is one of the publication's, given with ``reinitialize`` (before anything changes)."""
    if article is None:
        return
    names = [a.name for a in topology.publication(publication).articles]
    if article not in names:
        raise ReplError(
            f"article {article!r} does not exist in publication {publication!r} (its articles: "
            f"{', '.join(repr(n) for n in names)}): name one of them"
        )
    if not reinitialize:
        raise ReplError(
            f"--article {article!r} copies that article again: give --reinitialize with it (an article not "
            f"copied yet is copied by any Snapshot Agent run, without --article)"
        )


def _copy_articles(
    snap: _SnapshotRun,
    articles: list[ResolvedArticle],
    copies: dict[str, list[str]],
    spark: SparkSession,
    max_partitions: int | None,
    identify: Identify | None,
) -> dict[str, Any]:
    """Copy to active subscriptions the articles each lacks (subscriber -> article names), on
    their own: subscriptions lacking the same articles share one exported snapshot, whose
    consistent point is those articles' hand-off there; nothing else is copied again."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, names in sorted(copies.items()):
        groups.setdefault(tuple(sorted(names)), []).append(name)
    copied: dict[str, dict[str, int]] = {}
    out: dict[str, Any] = {"rows": 0, "initialized": [], "tables": {}, "copies": []}
    for arts, subs in groups.items():
        chosen = [a for a in articles if a.name in arts]
        init = _ArticleCopy(articles, snap.topology, snap.publication, chosen, subs, snap.dist, snap.run)
        snap.run.step = "waiting for the delivery of a batch to end"
        dist_subscription_articles.lock_subscriptions(snap.dist, snap.publication, subs)
        dist_subscription_articles.start_copies(snap.dist, snap.publication, init.copies)
        snap.dist.commit()  # no lock held while the slot is created (it waits for every transaction)
        taken = snap.take(chosen, True, spark, max_partitions, identify, init)
        manifest = snap.write_folder(chosen, taken)
        loaded = init.activate_all(manifest, taken.files)
        tables = _table_rows(chosen, taken.files)
        for sub in subs:
            copied[sub] = {f["name"]: int(f["rows"]) for f in manifest["articles"]}
        out["copies"].append({**taken.summary([], loaded), "subscribers": subs, "tables": tables})
        out["rows"] += taken.rows
        out["tables"].update(tables)
    out["articles_copied"] = copied
    out["snapshot_id"] = out["copies"][-1]["snapshot_id"]
    out["message"] = "; ".join(
        f"copied article(s) {', '.join(map(repr, sorted(arts)))} to subscriber(s) {', '.join(map(repr, subs))} "
        f"on their own (the other articles were not copied again)"
        for arts, subs in groups.items()
    )
    return out


def _table_rows(articles: list[ResolvedArticle], files: list[DataFile]) -> dict[str, int]:
    """Rows the snapshot holds per subscriber table (``schema.table``), which each initialized
    subscriber was loaded with (the operator's asset events are made from it)."""
    destination = {a.name: a.destination for a in articles}
    rows = dict.fromkeys(sorted(destination.values()), 0)
    for f in files:
        rows[destination[str(f["article"])]] += int(f["rows"])
    return rows


@dataclass
class _Taken:
    """A snapshot read into its folder."""

    snapshot_id: str
    folder: Path
    consistent_lsn: str
    partitions: int
    files: list[DataFile]
    needs: user_types.Requirements
    read_seconds: float
    plan_seconds: float
    spark_wait_seconds: float
    import_seconds: float

    @property
    def rows(self) -> int:
        return sum(int(f["rows"]) for f in self.files)

    def summary(self, initialized: list[str], load_stats: dict[str, Any]) -> dict[str, Any]:
        return {
            "snapshot_id": self.snapshot_id,
            "folder": str(self.folder),
            "consistent_lsn": self.consistent_lsn,
            "rows": self.rows,
            "partitions": self.partitions,
            "initialized": initialized,
            "plan_seconds": round(self.plan_seconds, 3),
            "spark_wait_seconds": round(self.spark_wait_seconds, 3),
            "import_seconds": round(self.import_seconds, 3),
            "read_seconds": round(self.read_seconds, 3),
            "rows_per_second": round(self.rows / self.read_seconds, 1) if self.read_seconds else None,
            "read_executors": sorted({str(f["executor"]) for f in self.files if f.get("executor")}),
            **load_stats,
        }


class _SnapshotRun:
    """One run of the Snapshot Agent, step by step (see :func:`run_snapshot`)."""

    def __init__(self, run: AgentRun, topology: Topology, publication: str, import_ahead: bool = False) -> None:
        self.run, self.topology, self.publication = run, topology, publication
        self.import_ahead = import_ahead
        #: the data files' modules, importing while the run checks, creates the slot and plans
        #: (None: imported by :meth:`take`, while a JVM starts)
        self.file_modules: snapshot_folder.FileModulesImport | None = None
        self.lines = progress_lines.Lines(run)  # its interval checked before anything changes
        self.pub_conninfo = topology.publisher.require("publisher")
        self._pub: psycopg.Connection[Any] | None = None  # see publisher()
        run.step = "connecting"
        self.dist = run.connect(topology.distributor.require("distributor"), "distributor")

    def plan_subscriptions(
        self, names: list[str], reinitialize: bool, article: str | None = None
    ) -> tuple[list[ResolvedArticle], list[str], dict[str, list[str]]]:
        """Check, apply the topology, and say which subscriptions to initialize and which
        articles to copy on their own to which active subscriptions."""
        self.run.step = "the checks"
        full = reinitialize and article is None
        _precheck_custom_procedures(self.run, self.topology, self.publication, names, full, self.dist)
        self.run.step = "applying the topology"
        articles = deploy.apply_topology(self.topology, [self.publication])[self.publication]
        if article is not None:
            targets, copies = list[str](), _one_article(self.dist, self.publication, names, article)
        else:
            targets, copies = _pending_subscribers(self.dist, self.publication, names, reinitialize, articles)
        self.dist.commit()
        if self.import_ahead and (targets or copies):  # a run with nothing to copy never imports them
            self.file_modules = snapshot_folder.FileModulesImport()
        return articles, targets, copies

    def publisher(self) -> psycopg.Connection[Any]:
        """The run's connection to the publisher (autocommit) for the slot's check, the types'
        check and each snapshot's plan, one after the other: one password exchange, not one per
        step.  Closed when the run ends (:class:`AgentRun` watches it)."""
        if self._pub is None or self._pub.closed:
            self._pub = self.run.connect(self.pub_conninfo, "publisher", autocommit=True)
        return self._pub

    def check_slot(self, targets: list[str]) -> bool:
        """Does the publication's slot exist?  A missing one must not have lost changes."""
        self.slot = dist_publications.slot_name(self.dist, self.publication)
        found = slots.exists(self.publisher(), self.slot)
        if not found:
            _check_slot_loss(self.dist, self.topology, self.publication, self.slot, targets)
        return found

    def check_subscriber_types(self, articles: list[ResolvedArticle], targets: list[str]) -> None:
        """The subscribers' types match the publisher's (refused before any slot exists)."""
        self.run.step = "the checks of the subscribers' types"
        pub = self.publisher()
        with pub.transaction():
            objects = user_types.read(pub, articles).objects
        _check_user_types(self.topology, targets, objects, self._connect_subscriber)

    def _connect_subscriber(self, name: str, conninfo: str) -> psycopg.Connection[Any]:
        return self.run.connect(conninfo, f"subscriber {name!r}")

    def take(
        self,
        articles: list[ResolvedArticle],
        has_slot: bool,
        spark: SparkSession,
        max_partitions: int | None,
        identify: Identify | None,
        init: _Initialization,
    ) -> _Taken:
        """Create the slot (a temporary one when the publication has its slot), plan the snapshot
        it exported, write the folder's scripts, prepare the subscribers to initialize (``init``),
        then read the snapshot into the folder and load it into them in the same Spark tasks;
        the snapshot ends when its connection closes."""
        snapshot_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)
        folder = Path(self.topology.snapshot_folder) / self.publication / snapshot_id
        folder.mkdir(parents=True, exist_ok=True)
        self.run.step = "the creation of the replication slot"
        repl_conn = connections.connect(self.pub_conninfo, "publisher", autocommit=True, replication="database")
        self.run.track(repl_conn, "publisher", self.pub_conninfo)
        try:
            temp_slot = f"airflow_repl_snap_{secrets.token_hex(8)}"  # temporary: dropped with its connection
            consistent_lsn, snapshot = slots.create_with_snapshot(
                repl_conn, temp_slot if has_slot else self.slot, permanent=not has_slot
            )
            init.at_consistent_point(snapshot_id, consistent_lsn)
            parallelism = max_partitions or max(1, spark.sparkContext.defaultParallelism * 2)
            started = time.monotonic()
            tasks, needs = self._plan(snapshot, articles, parallelism)
            plan_seconds = time.monotonic() - started
            self.run.step = "the writing of the snapshot folder"
            snapshot_folder.write_scripts(folder, articles, needs)
            loads = init.prepare_all(folder, snapshot_id, needs.objects)  # while Spark starts
            self.run.step = "the start of Spark"
            started = time.monotonic()
            if self.file_modules is not None:
                self.file_modules.wait()  # importing since the run knew it copies: what is left of it
            else:
                snapshot_folder.import_file_modules()  # while the JVM starts (jobs.session.StartingSession)
            import_seconds = time.monotonic() - started
            started = time.monotonic()
            spark.sparkContext  # noqa: B018 - waits for a session still starting (jobs.session.StartingSession)
            spark_wait = time.monotonic() - started
            self.run.spark_step(_read_step(loads), "publisher", self.pub_conninfo)
            started = time.monotonic()
            reading = _Reading(self.pub_conninfo, snapshot, str(folder), snapshot_id, loads)
            files = _read_partitions(spark, tasks, reading, self.lines, identify)
            read_seconds = time.monotonic() - started
        finally:
            repl_conn.close()  # ends the exported snapshot (and drops a temporary slot)
        return _Taken(
            snapshot_id,
            folder,
            consistent_lsn,
            len(tasks),
            files,
            needs,
            read_seconds,
            plan_seconds,
            spark_wait,
            import_seconds,
        )

    def _plan(
        self, snapshot: str, articles: list[ResolvedArticle], parallelism: int
    ) -> tuple[list[Partition], user_types.Requirements]:
        """Block ranges and the user types the articles need, as of the exported snapshot."""
        self.run.step = "the planning of the snapshot"
        planner = self.publisher()
        slots.join_snapshot(planner, snapshot)
        tasks = [t for art in articles for t in snapshot_folder.plan_partitions(planner, art, parallelism)]
        needs = user_types.read(planner, articles)
        planner.execute("COMMIT")
        return tasks, needs

    def write_folder(self, articles: list[ResolvedArticle], taken: _Taken) -> dict[str, Any]:
        """The folder's manifest (its scripts are written before the read), and the snapshot's
        entry in the distribution database; returns the manifest."""
        self.run.step = "the writing of the snapshot folder"
        manifest = snapshot_folder.write_manifest(
            taken.folder,
            taken.snapshot_id,
            self.publication,
            taken.consistent_lsn,
            articles,
            taken.files,
            taken.needs.objects,
        )
        dist_publications.record_snapshot(
            self.dist, self.publication, taken.snapshot_id, str(taken.folder), taken.consistent_lsn, manifest
        )
        self.dist.commit()
        return manifest


@dataclass(frozen=True)
class _Reading:
    """What every read task needs (plain values: the tasks are shipped to the executors)."""

    conninfo: str  # the publisher
    snapshot: str  # the exported snapshot
    folder: str
    snapshot_id: str
    loads: list[LoadTarget]  # the subscribers loaded with the rows as they are read


def _read_step(loads: list[LoadTarget]) -> str:
    if not loads:
        return "the read of the snapshot"
    names = [name for name, _ in loads]
    who = f"subscriber {names[0]!r}" if len(names) == 1 else f"subscribers {', '.join(map(repr, names))}"
    return f"the read of the snapshot and the data load of {who}"


def _read_partitions(
    spark: SparkSession,
    tasks: list[Partition],
    reading: _Reading,
    lines: progress_lines.Lines,
    identify: Identify | None = None,
) -> list[DataFile]:
    """Read every block range into its data file and load it into the subscribers being
    initialized, one Spark task each (the task closes over plain values only); with
    ``identify``, each file names the executor that read it.  Progress lines: rows copied per
    article out of the plan's count, and rows loaded per article and subscriber."""
    copied: dict[str, int] = {}
    loaded: dict[str, int] = {}
    for t in tasks:
        article, rows = t["article"]["name"], int(t["estimated_rows"])
        copied[f"article {article!r}"] = rows  # the article's count, on each of its tasks
        for name, _ in reading.loads:
            loaded[_load_key(article, name)] = rows
    context = spark.sparkContext
    with (
        progress_lines.Counted(lines, context, copied, "copied") as copies,
        progress_lines.Counted(lines, context, loaded, "loaded") as loads,
    ):
        copy_counts, load_counts = copies.accumulators, loads.accumulators

        def read(task: Partition) -> DataFile:
            file = snapshot_folder.read_partition(
                reading.conninfo, reading.snapshot, reading.folder, task, reading.loads, reading.snapshot_id
            )
            copy_counts[f"article {file['article']!r}"].add(int(file["rows"]))
            for name, _ in reading.loads:
                load_counts[_load_key(file["article"], name)].add(int(file["rows"]))
            return {**file, "executor": identify()} if identify else file

        rdd = context.parallelize(tasks, len(tasks))
        return rdd.map(read).collect()


# ---------------------------------------------------------------------- initializing subscriptions
class _Initialization:
    """Initializing subscriptions from the snapshot being taken: before the read, each is marked
    'initializing' and gets its tables and procedures (:meth:`prepare_all`); the read tasks load
    the rows; then each gets its keys, the row check, its watermark and 'active'
    (:meth:`activate_all`)."""

    def __init__(
        self,
        topology: Topology,
        publication: str,
        articles: list[ResolvedArticle],
        subscribers: list[str],
        dist: psycopg.Connection[Any],
        run: AgentRun,
    ) -> None:
        self.topology, self.publication, self.articles = topology, publication, articles
        self.dist, self.run = dist, run
        self.conninfos = {s: topology.subscriber_conninfo(s) for s in subscribers}
        modes = {s: topology.subscription(publication, s).update_mode for s in subscribers}
        self.queued = {s for s, mode in modes.items() if mode.needs_queued_tran}  # now or after a switch
        self.immediate = {s for s, mode in modes.items() if mode.needs_sync_tran}
        self.pub_conninfo = topology.publisher.require("publisher") if self.immediate else ""
        self.updatable = {s for s in subscribers if topology.subscription(publication, s).update_mode.updatable}
        self.seconds = 0.0  # spent preparing and activating (the rows load while the snapshot is read)
        #: subscriber -> the connection its checks used, which its preparation then uses
        self._kept: dict[str, psycopg.Connection[Any]] = {}

    def at_consistent_point(self, snapshot_id: str, consistent_lsn: str) -> None:
        """The snapshot's slot was created (a copy of articles of their own records its hand-off)."""

    def prepare_all(self, folder: Path, snapshot_id: str, objects: list[user_types.UserObject]) -> list[LoadTarget]:
        """Check the snapshot's user types at every subscriber first, then prepare each; returns
        the subscribers the read tasks load."""
        if not self.conninfos:
            return []
        started = time.monotonic()
        self.snapshot_id = snapshot_id
        self.schema_sql = (folder / "schema.sql").read_text()
        self.procs_sql = (folder / "procedures.sql").read_text()
        self.keys_sql = (folder / "keys.sql").read_text()
        try:
            _check_user_types(self.topology, list(self.conninfos), objects, self._connect_kept)
            for name in self.conninfos:
                self.prepare(name)
        finally:
            for conn in self._kept.values():  # a check refused a subscriber: the others' connections
                conn.close()
            self._kept.clear()
        self.seconds += time.monotonic() - started
        return list(self.conninfos.items())

    def activate_all(self, manifest: dict[str, Any], files: list[DataFile]) -> dict[str, Any]:
        """Activate every subscription loaded; the summary's load figures."""
        if not self.conninfos:
            return {"load_seconds": 0.0, "load_executors": []}
        started = time.monotonic()
        for name in self.conninfos:
            self.activate(name, manifest)
        self.seconds += time.monotonic() - started
        executors = sorted({str(f["executor"]) for f in files if f.get("executor")})
        return {"load_seconds": round(self.seconds, 3), "load_executors": executors}

    def take_turns(self) -> list[subscriber_writer.Turns]:
        """The writer turn at each queued subscriber to initialize (waiting for a Queue Reader's
        transaction or a Distribution Agent's batch there to commit), held on a connection of
        its own until the run ends: no queued transaction of theirs is applied at the publisher
        after the snapshot's consistent point (:mod:`~airflow_repl.engine.runtime.subscriber_writer`)."""
        turns: list[subscriber_writer.Turns] = []
        for name in sorted(self.queued):
            self.run.step = f"waiting for the turn to write at subscriber {name!r}"
            turn = subscriber_writer.Turns(
                self.run.connect(self.conninfos[name], f"subscriber {name!r}"), self.publication
            )
            turn.take()
            turns.append(turn)
        return turns

    def connect(self, name: str, conninfo: str) -> psycopg.Connection[Any]:
        self.run.step = f"the initialization of subscriber {name!r}"
        kept = self._kept.pop(name, None)
        return kept if kept is not None else self.run.connect(conninfo, f"subscriber {name!r}")

    def _connect_kept(self, name: str, conninfo: str) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A connection for a subscriber's checks, kept open for its preparation (:meth:`connect`
        hands it over): one connection, not two, each a password exchange."""
        self._kept[name] = self.connect(name, conninfo)
        return nullcontext(self._kept[name])

    def prepare(self, name: str) -> None:
        """Mark the subscription 'initializing', then (re)create its tables and procedures."""
        dist_subscriptions.mark_initializing(self.dist, self.publication, name, self.snapshot_id)
        self.dist.commit()
        if self.topology.is_mariadb_subscriber(name):
            from airflow_repl.engine.agents import mariadb_snapshot
            from airflow_repl.engine.subscriber import mariadb_calls

            self.run.step = f"the initialization of MariaDB subscriber {name!r}"
            mariadb_snapshot.prepare(self.conninfos[name], name, self.publication, self._mariadb_plan(name))
            mariadb_calls.create_procedures(self.conninfos[name], name, self.articles)
            return
        with self.connect(name, self.conninfos[name]) as sub:
            _check_custom_procedures(sub, self.articles, name)  # before anything is dropped
            subscriber_state.reset_for_snapshot(sub, self.publication)
            sub.execute(self.schema_sql)
            if name in self.updatable:  # row versions kept current by the subscriber's own updates
                sub.execute("".join(updating_scripts.row_version_script(a) for a in self.articles).encode())
            if self.procs_sql.strip():
                sub.execute(self.procs_sql)

    def _mariadb_plan(self, name: str) -> list[mariadb_snapshot.TablePlan]:
        from airflow_repl.engine.agents import mariadb_snapshot

        if not hasattr(self, "_kinds"):
            with self.run.connect(self.topology.publisher.require("publisher"), "publisher") as pub:
                self._kinds = mariadb_snapshot.user_type_kinds(pub, self.articles)
        return mariadb_snapshot.plan_tables(self.articles, self._kinds, name)

    def activate(self, name: str, manifest: dict[str, Any]) -> None:
        """Check the loaded rows, start the watermark, and mark the subscription 'active'."""
        if self.topology.is_mariadb_subscriber(name):
            from airflow_repl.engine.agents import mariadb_snapshot

            self.run.step = f"the activation of MariaDB subscriber {name!r}"
            plan = self._mariadb_plan(name)
            mariadb_snapshot.activate(self.conninfos[name], name, self.publication, plan, manifest, self.snapshot_id)
            dist_subscriptions.activate_subscription(
                self.dist, self.publication, name, manifest["consistent_lsn"], definition_hash(self.articles)
            )
            self.dist.commit()
            return
        with self.connect(name, self.conninfos[name]) as sub:
            self._check_loaded(sub, name, manifest)
            subscriber_state.start_watermark(sub, self.publication, self.snapshot_id, manifest["consistent_lsn"])
            self._install_updating(sub, name)
        dist_subscriptions.activate_subscription(
            self.dist, self.publication, name, manifest["consistent_lsn"], definition_hash(self.articles)
        )
        names = [a.name for a in self.articles]
        dist_subscription_articles.record_all_active(self.dist, self.publication, name, names, self.snapshot_id)
        self.dist.commit()

    def _check_loaded(self, sub: psycopg.Connection[Any], name: str, manifest: dict[str, Any]) -> None:
        """The loaded tables' keys and the row check against the manifest.  Their statistics are
        left to autovacuum's ANALYZE, as native's table sync leaves them: the keys' build has
        already set the tables' row counts the planner reads, and an ANALYZE here (a scan of up
        to 30,000 rows per table, half the bookkeeping of a 100,000-row article) guarantees nothing."""
        self._add_keys(sub, name)
        _check_loaded_rows(sub, self.articles, manifest, name)

    def _install_updating(self, sub: psycopg.Connection[Any], name: str) -> None:
        """An updatable subscriber's queue or immediate triggers on the loaded tables."""
        immediate_now = self._immediate_now(name)
        if name in self.queued:
            install_queue(sub, self.articles, enabled=not immediate_now)
        if name in self.immediate:
            link = subscriber_immediate.PublisherLink(
                name,
                naming.immediate_gid_prefix(self.publication, name),
                naming.queue_origin(name),
                self.pub_conninfo,
            )
            install_immediate(sub, self.articles, link, enabled=immediate_now)

    def _add_keys(self, sub: psycopg.Connection[Any], name: str) -> None:
        """The tables' keys, built once over the loaded rows (in the activation's transaction)."""
        if not self.keys_sql.strip():
            return
        try:
            sub.execute(self.keys_sql)
        except (psycopg.errors.UniqueViolation, psycopg.errors.ExclusionViolation) as exc:
            raise ReplError(
                f"the rows of publication {self.publication!r} break a key at subscriber {name!r}: "
                f"{exc.diag.message_primary} ({exc.diag.message_detail}). Rows distinct at the publisher "
                f"are equal under the subscriber's collation: give the subscriber database or the columns "
                f"a deterministic collation, then run the Snapshot Agent again"
            ) from None

    def _immediate_now(self, name: str) -> bool:
        """The subscription updates immediately now: ``sync tran``, or a failover subscription
        whose recorded mode (``set-update-mode``) is immediate."""
        if name not in self.immediate:
            return False
        state = dist_subscriptions.subscription_updating(self.dist, self.publication, name)
        return (
            state is None
            or state.update_mode not in dist_subscriptions.FAILOVER_MODES
            or state.update_mode == "failover"
        )


class _ArticleCopy(_Initialization):
    """Articles copied on their own to active subscriptions (an article added to the live
    publication, or ``--article A --reinitialize``): the other articles keep being delivered.

    The caller marks the copies 'copying' while it holds the subscriptions' rows at the
    distributor (a batch being delivered ends first); their delivery stops there until the
    hand-off, recorded at the snapshot's consistent point; then it goes on up to the hand-off
    until the copy is done, and then skips the articles' commands up to it
    (:mod:`~airflow_repl.engine.state.dist_subscription_articles`).  Only those articles'
    tables are created (dropped first), loaded and given their procedures and triggers; the
    watermark and the queue stay.  A copy that stops halfway stays ``copying``: the next run
    copies those articles again."""

    def __init__(self, everything: list[ResolvedArticle], *args: Any) -> None:
        super().__init__(*args)  # (topology, publication, the articles to copy, subscribers, dist, run)
        self.everything = everything  # every article of the publication, as applied
        self.copying = {a.name for a in self.articles}
        #: subscriber -> the articles it held before (those the copy adds to its definitions' hash)
        self.had = {
            name: dist_subscription_articles.held_names(
                dist_subscription_articles.held_articles(self.dist, self.publication, name),
                dist_subscription_articles.ACTIVE,
            )
            for name in self.conninfos
        }

    @property
    def copies(self) -> dict[str, list[str]]:
        return {name: sorted(self.copying) for name in self.conninfos}

    def at_consistent_point(self, snapshot_id: str, consistent_lsn: str) -> None:
        dist_subscription_articles.set_handoff(self.dist, self.publication, self.copies, snapshot_id, consistent_lsn)
        self.dist.commit()

    def prepare(self, name: str) -> None:
        """The articles' tables (dropped first), row versions and procedures, and nothing else."""
        with self.connect(name, self.conninfos[name]) as sub:
            _check_custom_procedures(sub, self.articles, name)
            sub.execute(self.schema_sql)
            if name in self.updatable:
                sub.execute("".join(updating_scripts.row_version_script(a) for a in self.articles).encode())
            if self.procs_sql.strip():
                sub.execute(self.procs_sql)

    def activate(self, name: str, manifest: dict[str, Any]) -> None:
        """Check the loaded rows, add the keys and the updating triggers, the articles into the
        subscriber's definitions; then they are active at the distributor."""
        before = [a for a in self.everything if a.name in self.had[name]]
        after = [a for a in self.everything if a.name in self.had[name] | self.copying]
        with self.connect(name, self.conninfos[name]) as sub:
            self._check_loaded(sub, name, manifest)
            self._install_updating(sub, name)
            position = subscriber_state.watermark(sub, self.publication)
            stored = subscriber_state.articles_hash(sub, self.publication)
            new = dist_publications.rehashed(self.dist, self.publication, stored, position, before, after)
            if new is not None:
                subscriber_state.set_articles_hash(sub, self.publication, new)
        self.dist.rollback()
        stored = dist_subscriptions.subscription_articles_hash(self.dist, self.publication, name)
        position = dist_subscriptions.delivered_position(self.dist, self.publication, name)
        new = dist_publications.rehashed(self.dist, self.publication, stored, position, before, after)
        if new is not None:
            dist_subscriptions.set_subscription_articles_hash(self.dist, self.publication, name, new)
        rows = {a["name"]: int(a["rows"]) for a in manifest["articles"]}
        dist_subscription_articles.finish_copy(self.dist, self.publication, name, rows, self.snapshot_id)
        self.dist.commit()


def install_queue(sub: psycopg.Connection[Any], articles: list[ResolvedArticle], *, enabled: bool = True) -> None:
    """A queued updating subscription: the queue, and the queue trigger on each article table
    (after the load, which must not be queued; committed by the caller).  ``enabled=False``: a
    failover subscription updating immediately now (the trigger is there, disabled)."""
    subscriber_state.ensure_queue(sub)
    for art in articles:
        sub.execute(queue_triggers.install(art))
        if not enabled:
            sub.execute(
                trigger_switching.switch_triggers(
                    art.dest_schema, art.dest_table, [queue_triggers.TRIGGER], enabled=False
                )
            )


def install_immediate(
    sub: psycopg.Connection[Any],
    articles: list[ResolvedArticle],
    publisher: subscriber_immediate.PublisherLink,
    *,
    enabled: bool,
) -> None:
    """An immediate updating subscription: dblink, the subscriber's immediate tables with the
    publisher's connection string (never logged), the functions, and the two triggers on each
    article table (after the load; committed by the caller)."""
    dblink_schema = subscriber_immediate.ensure_immediate(sub)
    sub.execute(immediate_triggers.functions_script(dblink_schema).encode())
    for publication in sorted({art.publication for art in articles}):
        subscriber_immediate.set_publisher(sub, publication, publisher)
    for art in articles:
        sub.execute(immediate_triggers.install(art, enabled=enabled))


def _load_key(article: str, subscriber: str) -> str:
    return f"article {article!r} at subscriber {subscriber!r}"


# ---------------------------------------------------------------------- checks
def _named_subscribers(topology: Topology, publication: str, subscribers: list[str] | None) -> list[str]:
    """The subscriptions the run is about; an unknown one is an error before anything changes."""
    names = subscribers or [s.subscriber for s in topology.subscriptions_of(publication)]
    for name in names:
        topology.subscription(publication, name)  # unknown subscription -> error
    return names


def _pending_subscribers(
    dist: psycopg.Connection[Any],
    publication: str,
    names: list[str],
    reinitialize: bool,
    articles: list[ResolvedArticle],
) -> tuple[list[str], dict[str, list[str]]]:
    """The named subscriptions to initialize: those not active (all with ``reinitialize``); and
    the articles to copy on their own to the active ones: those each does not hold yet (added
    to the publication since, or whose copy of their own did not finish).  An active one
    whose article definitions (those it was initialized with, changed by the schema changes
    delivered to it) are not the publication's, but for the articles it lacks, must be
    reinitialized."""
    if reinitialize:
        return names, {}
    active = dist_subscriptions.active_subscriptions(dist, publication)
    copies: dict[str, list[str]] = {}

    def has(name: str, stored: str | None) -> bool:
        position = dist_subscriptions.delivered_position(dist, publication, name)
        held = dist_subscription_articles.held_articles(dist, publication, name)
        copied = dist_subscription_articles.held_names(held, dist_subscription_articles.ACTIVE)
        mine = [a for a in articles if a.name in copied] if held else articles
        lacking = [a.name for a in articles if a.name not in copied] if held else []
        if stored is not None and stored not in {
            definition_hash(dist_publications.definitions_at(dist, publication, position, d))
            for d in (mine, [a for a in articles if a.name in copied or a.name in lacking])
        }:
            return False
        if lacking:
            copies[name] = lacking
        return True

    changed = sorted(n for n, h in active.items() if n in names and not has(n, h))
    if changed:
        raise ReplError(
            f"the articles of publication {publication!r} changed since subscriber(s) "
            f"{', '.join(changed)} were initialized: run the Snapshot Agent with reinitialize for them"
        )
    return [n for n in names if n not in active], copies


def _one_article(
    dist: psycopg.Connection[Any], publication: str, names: list[str], article: str
) -> dict[str, list[str]]:
    """``--article A --reinitialize``: A copied again, on its own, to each named subscription
    (each must be active: one not initialized yet gets every article with its snapshot)."""
    active = dist_subscriptions.active_subscriptions(dist, publication)
    idle = [n for n in names if n not in active]
    if idle:
        raise ReplError(
            f"subscriber(s) {', '.join(map(repr, idle))} of publication {publication!r} are not initialized, so "
            f"article {article!r} cannot be copied to them on its own: run the Snapshot Agent without --article"
        )
    return {n: [article] for n in names}


def _check_slot_loss(
    dist: psycopg.Connection[Any], topology: Topology, publication: str, slot: str, targets: list[str]
) -> None:
    """A missing slot for a publication that was already being read means changes were lost
    (the slot was dropped or invalidated): only reinitializing every subscription repairs that."""
    was_read = dist_publications.publication_was_read(dist, publication)
    dist.commit()
    everyone = {s.subscriber for s in topology.subscriptions_of(publication)}
    if was_read and not everyone <= set(targets):
        raise ReplError(
            f"the replication slot {slot!r} of publication {publication!r} is missing at the publisher (dropped "
            f"or invalidated), so changes made since it was last read are lost for its subscriptions: run the "
            f"Snapshot Agent with reinitialize for every subscription of the publication"
        )


def _precheck_custom_procedures(
    run: AgentRun,
    topology: Topology,
    publication: str,
    names: list[str],
    reinitialize: bool,
    dist: psycopg.Connection[Any],
) -> None:
    """Custom procedures must exist at every subscription about to be initialized: checked
    before the topology is applied, so that a rejection leaves nothing half-made."""
    active = set() if reinitialize else set(dist_subscriptions.active_subscriptions(dist, publication))
    dist.commit()
    mariadb = [n for n in names if n not in active and topology.is_mariadb_subscriber(n)]
    custom = any(
        prop.method == "proc" and prop.custom
        for a in topology.publication(publication).articles
        for prop in (a.ins_cmd, a.upd_cmd, a.del_cmd)
    )
    if not mariadb and not custom:  # nothing to check: the publisher's catalog is read once, by the apply
        return
    with run.connect(topology.publisher.require("publisher"), "publisher") as pub_conn:
        articles = deploy.resolve_publication(pub_conn, topology.publication(publication))
        if mariadb:  # MariaDB subscribers: reachable, and every column mapped (its modules loaded only then)
            from airflow_repl.engine.agents import mariadb_snapshot
            from airflow_repl.engine.mariadb import connections as mariadb_connections
            from airflow_repl.engine.subscriber import mariadb_calls

            kinds = mariadb_snapshot.user_type_kinds(pub_conn, articles)
            for name in mariadb:
                run.step = f"the checks of MariaDB subscriber {name!r}"
                mariadb_snapshot.plan_tables(articles, kinds, name)
                conn = mariadb_snapshot.connect(topology.subscriber_conninfo(name), name)
                try:  # custom procedures there (generated ones are created by the snapshot)
                    database = mariadb_connections.database(topology.subscriber_conninfo(name))
                    mariadb_calls.check_procedures(conn, database, articles, name, custom_only=True)
                finally:
                    conn.close()
    if not any(prop.method == "proc" and prop.custom for a in articles for prop in a.propagation.values()):
        return
    for name in names:
        if name not in active and not topology.is_mariadb_subscriber(name):
            with run.connect(topology.subscriber_conninfo(name), f"subscriber {name!r}") as sub:
                _check_custom_procedures(sub, articles, name)


def _check_loaded_rows(
    sub: psycopg.Connection[Any], articles: list[ResolvedArticle], manifest: dict[str, Any], subscriber: str
) -> None:
    """Every article's subscriber table holds exactly the snapshot's rows, or the subscription
    is not activated (it stays 'initializing')."""
    expected = {a["name"]: a["rows"] for a in manifest["articles"]}
    for art in articles:
        count = sub.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(art.dest_schema, art.dest_table))
        ).fetchone()
        rows = count[0] if count is not None else None
        if rows != expected[art.name]:
            raise ReplError(
                f"subscriber {subscriber!r} holds {rows} rows in {art.destination} after loading the snapshot of "
                f"article {art.name!r}, which has {expected[art.name]}: the subscription was not activated; "
                f"check the subscriber table for triggers or rules that change rows, then run the Snapshot Agent "
                f"with reinitialize for it"
            )


def _check_user_types(
    topology: Topology, subscribers: list[str], objects: list[user_types.UserObject], connect: Connect
) -> None:
    """Refuse, before any of them changes, subscribers whose types differ from the publisher's."""
    for name in subscribers:
        if topology.is_mariadb_subscriber(name):
            continue  # its columns are mapped by type (mariadb_snapshot.plan_tables)
        with connect(name, topology.subscriber_conninfo(name)) as sub:
            user_types.check(sub, objects, name)


def _check_custom_procedures(sub: psycopg.Connection[Any], articles: list[ResolvedArticle], subscriber: str) -> None:
    """Every custom procedure the articles call exists at the subscriber."""
    for art in articles:
        for op, prop in art.propagation.items():
            if prop.method == "proc" and prop.custom:
                _check_custom_procedure(sub, art, op, subscriber)


def _check_custom_procedure(sub: psycopg.Connection[Any], art: ResolvedArticle, op: Operation, subscriber: str) -> None:
    """The custom procedure of ``op`` exists and takes the parameters its call syntax passes."""
    syntax, procedure = art.propagation[op].syntax, art.procedure(op)
    assert syntax is not None and procedure is not None  # a procedure call has both
    schema, name = procedure
    params = call_syntax.parameters(art, op, syntax)
    counts = [
        r[0]
        for r in sub.execute(
            "SELECT p.pronargs FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n "
            "ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = %s AND p.prokind = 'p'",
            (schema, name),
        )
    ]
    if not counts:
        raise ReplError(
            f"custom procedure {schema}.{name} (the {op} command of article {art.name!r}) does "
            f"not exist at subscriber {subscriber!r}: create it there before initializing the "
            f"subscription, or change the article's {op[:3]}_cmd option"
        )
    if len(params) not in counts:
        raise ReplError(
            f"custom procedure {schema}.{name} (the {op} command of article {art.name!r}) at "
            f"subscriber {subscriber!r} takes {' or '.join(map(str, counts))} parameter(s), but "
            f"{syntax} syntax passes {len(params)}: "
            f"{', '.join(f'{p} {t}' for p, t in params)}"
        )
