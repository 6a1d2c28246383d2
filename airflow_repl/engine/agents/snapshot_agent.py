"""The Snapshot Agent: a consistent initial copy of a publication, and initializing
subscriptions from it.

Consistency without blocking writers: the publication's logical slot is created with an
exported snapshot (a temporary slot when the publication's slot already exists).  Every reader,
on every Spark executor, joins that snapshot with ``SET TRANSACTION SNAPSHOT``, so all
partitions see the database exactly as of the slot's consistent point.  Transactions that
commit at or after that point are exactly the ones the slot decodes, so the subscription's
watermark starts just before it: rows written during the snapshot are neither lost nor doubled.

A snapshot folder (one per publication and run) holds ``schema.sql``, ``procedures.sql``,
Parquet data files (``data/<article>-<hash>/part-NNNNN.parquet``, one per key range) and
``manifest.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import secrets
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql

from airflow_repl.engine.agents.lifecycle import AgentRun
from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.codegen import call_syntax, procedures, user_types
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections, raw_sql
from airflow_repl.engine.postgres.quoting import dollar_quote, ident, literal, qualified
from airflow_repl.engine.provisioning import deploy
from airflow_repl.engine.state import distdb, subscriber_state

log = logging.getLogger(__name__)
AGENT = "snapshot"

#: PostgreSQL types stored as typed Parquet columns; every other type is stored as its
#: PostgreSQL text form (exact for numeric, timestamps, arrays, json, ...) and typed by the manifest.
ARROW_TYPES = {
    16: pa.bool_(),
    20: pa.int64(),
    21: pa.int16(),
    23: pa.int32(),
    700: pa.float32(),
    701: pa.float64(),
    25: pa.string(),
    1043: pa.string(),
    1042: pa.string(),
    17: pa.binary(),
}
ROWS_PER_PARTITION = 50_000
FETCH_ROWS = 10_000


# ---------------------------------------------------------------------- scripts
def schema_script(article: ResolvedArticle, collations: dict[str, str] | None = None) -> str:
    """DROP + CREATE of the subscriber table (SQL Server's pre-creation command 'drop');
    ``collations`` maps columns to their (quoted) collation where it is not their type's default.
    Stored generated columns are created with the publisher's expression, in their place,
    unless they read a column the article filters out."""
    collations = collations or {}
    place = {c.name: i for i, c in enumerate(article.table.columns)}
    cols = [
        line
        for _, line in sorted(
            [
                (
                    (place[c.name], 1, 0),
                    f"    {ident(c.name)} {c.type}"
                    f"{' COLLATE ' + collations[c.name] if c.name in collations else ''}{' NOT NULL' if c.not_null else ''}",
                )
                for c in article.columns
            ]
            + [
                ((g.position, 0, i), f"    {ident(g.name)} {g.type} GENERATED ALWAYS AS ({g.expression}) STORED")
                for i, g in enumerate(article.table.generated)
                if set(g.depends_on) <= set(article.column_names)
            ]
        )
    ]
    keys = [("PRIMARY KEY", article.primary_key)] + [
        ("UNIQUE", key) for key in article.table.unique_keys if set(key) <= set(article.column_names)
    ]
    cols += [_key_clause(kind, key, article.table.deferral(key)) for kind, key in keys]
    table = qualified(article.dest_schema, article.dest_table)
    deferrable = any(article.table.deferral(key) for _, key in keys)
    return (
        f"CREATE SCHEMA IF NOT EXISTS {ident(article.dest_schema)};\n"
        f"DROP TABLE IF EXISTS {table} CASCADE;\n"
        f"CREATE TABLE {table} (\n"
        + ",\n".join(cols)
        + "\n);\n"
        + (_enforce_deferrable_keys(table) if deferrable else "")
    )


def _enforce_deferrable_keys(table: str) -> str:
    """A DEFERRABLE key is checked by an internal trigger, which, like every trigger, does not fire
    under ``session_replication_role = replica`` (the Distribution Agent's and the loader's): a
    duplicate key would get in silently.  Firing it ALWAYS keeps the key enforced there."""
    body = (
        "DECLARE\n    trigger_name name;\nBEGIN\n"
        "    FOR trigger_name IN SELECT t.tgname FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_constraint k "
        f"ON k.oid = t.tgconstraint\n        WHERE t.tgrelid = {literal(table)}::regclass AND t.tgisinternal "
        "AND k.contype IN ('p', 'u') LOOP\n"
        f"        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', {literal(table)}::regclass, "
        "trigger_name);\n    END LOOP;\nEND;\n"
    )
    return f"DO {dollar_quote(body)};\n"


def _key_clause(kind: str, key: list[str], deferral: str) -> str:
    """A PRIMARY KEY / UNIQUE table constraint, as deferrable as at the publisher."""
    return f"    {kind} ({', '.join(ident(c) for c in key)}){' ' + deferral if deferral else ''}"


def _select_list(article: ResolvedArticle) -> sql.Composable:
    """The article's columns; those without an Arrow type as their type's output text, which is
    what pgoutput sends for later changes and what native replication copies.  Not ``::text``:
    a cast to text differs from the output function for some types (``xml`` keeps a default
    XML declaration that xml_out drops; ``inet`` adds ``/32``).  ``concat`` calls the output
    function (and NULL stays NULL through the CASE)."""
    parts = []
    for c in article.columns:
        col = sql.Identifier(c.name)
        parts.append(
            col
            if c.type_oid in ARROW_TYPES
            else sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE pg_catalog.concat({c}) END").format(c=col)
        )
    return sql.SQL(", ").join(parts)


def arrow_schema(article: ResolvedArticle) -> pa.Schema:
    return pa.schema(
        [
            pa.field(
                c.name, ARROW_TYPES.get(c.type_oid, pa.string()), nullable=not c.not_null, metadata={"pg_type": c.type}
            )
            for c in article.columns
        ]
    )


# ---------------------------------------------------------------------- partitions
# Key ranges exist on the publisher side only: they are planned and read inside the same
# exported snapshot, under the publisher's own ordering.  The subscriber never evaluates a
# range (its collation may order the keys differently): each file loads exactly once thanks to
# the ledger below, so no step depends on two servers ordering keys alike.
def _key_tuple(article: ResolvedArticle) -> sql.Composable:
    return sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in article.primary_key))


def _key_values(article: ResolvedArticle, values: list) -> sql.Composable:
    # literals, not parameters: a statement embedding identifiers is never scanned for placeholders
    types = [article.table.column(c).type for c in article.primary_key]
    return sql.SQL("({})").format(
        sql.SQL(", ").join(sql.SQL("{}::" + t).format(sql.Literal(v)) for v, t in zip(values, types))
    )


def _filter(article: ResolvedArticle) -> sql.Composable:
    """The article's row filter (PostgreSQL's own deparsed, validated form), or true."""
    return sql.SQL("({})").format(sql.SQL(article.row_filter)) if article.row_filter else sql.SQL("true")


def plan_partitions(conn: psycopg.Connection, article: ResolvedArticle, max_parts: int) -> list[dict]:
    """Key ranges of roughly equal size, computed inside the exported snapshot."""
    rows = raw_sql.execute(
        conn, sql.SQL("SELECT count(*) FROM {} WHERE {}").format(article.source, _filter(article))
    ).fetchone()[0]
    parts = max(1, min(max_parts, math.ceil(rows / ROWS_PER_PARTITION)))
    bounds: list[list[str]] = []
    if parts > 1:
        step = math.ceil(rows / parts)
        pk = [sql.Identifier(c) for c in article.primary_key]
        bounds = [
            list(r)
            for r in raw_sql.execute(
                conn,
                sql.SQL(
                    "SELECT {keys} FROM (SELECT {keys_text}, row_number() OVER (ORDER BY {order}) AS rn "
                    "FROM {t} WHERE {where}) s WHERE rn % {step} = 1 AND rn > 1 ORDER BY rn"
                ).format(
                    keys=sql.SQL(", ").join(pk),
                    keys_text=sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(c, c) for c in pk),
                    order=sql.SQL(", ").join(pk),
                    t=article.source,
                    where=_filter(article),
                    step=sql.Literal(step),
                ),
            )
        ]
    edges = [None, *bounds, None]
    return [
        {"article": article.to_dict(), "index": i, "lower": edges[i], "upper": edges[i + 1], "estimated_rows": rows}
        for i in range(len(edges) - 1)
    ]


def _folder_name(article: str) -> str:
    """A file-system-safe folder for an article's data files (article names may hold any character)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", article).strip(".") or "article"
    return f"{safe[:60]}-{hashlib.sha1(article.encode()).hexdigest()[:8]}"


def read_partition(conninfo: str, snapshot_name: str, folder: str, task: dict) -> dict:
    """Executor side: read one key range inside the exported snapshot into a Parquet file."""
    article = ResolvedArticle.from_dict(task["article"])
    query = sql.SQL("SELECT {} FROM {} WHERE {} AND {}").format(
        _select_list(article), article.source, _range_condition(article, task["lower"], task["upper"]), _filter(article)
    )
    rel = Path("data") / _folder_name(article.name) / f"part-{task['index']:05d}.parquet"
    path = Path(folder) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = arrow_schema(article)
    rows = 0
    with connections.connect(conninfo, "publisher", autocommit=True) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        with conn.cursor(name="airflow_repl_snapshot") as cur, pq.ParquetWriter(str(path), schema) as writer:
            cur.execute(query)  # no parameters: the text is sent as it is
            while batch := cur.fetchmany(FETCH_ROWS):
                columns = list(zip(*batch))
                writer.write_batch(
                    pa.record_batch([pa.array(col, type=f.type) for col, f in zip(columns, schema)], schema=schema)
                )
                rows += len(batch)
        conn.execute("COMMIT")
    return {"article": article.name, "path": str(rel), "rows": rows, "lower": task["lower"], "upper": task["upper"]}


def _range_condition(article: ResolvedArticle, lower, upper) -> sql.Composable:
    where = []
    if lower is not None:
        where.append(sql.SQL("{} >= {}").format(_key_tuple(article), _key_values(article, lower)))
    if upper is not None:
        where.append(sql.SQL("{} < {}").format(_key_tuple(article), _key_values(article, upper)))
    return sql.SQL(" AND ").join(where) if where else sql.SQL("true")


def load_file(conninfo: str, folder: str, article_data: dict, file: dict, snapshot_id: str) -> int:
    """Executor side: bulk-load one Parquet file into the subscriber table with COPY, exactly
    once: the file is entered in the subscriber's ledger in the same transaction (a concurrent
    attempt waits for it, then finds the entry).  Returns the rows loaded by this call."""
    article = ResolvedArticle.from_dict(article_data)
    rel_path = file["path"]
    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(article.dest_schema, article.dest_table),
        sql.SQL(", ").join(sql.Identifier(c) for c in article.column_names),
    )
    rows = 0
    with connections.connect(conninfo, "subscriber") as conn:
        conn.execute("SET session_replication_role = replica")
        first = conn.execute(
            "INSERT INTO airflow_repl.snapshot_files (publication, snapshot_id, path, rows) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING 1",
            (article.publication, snapshot_id, rel_path, file["rows"]),
        ).fetchone()
        if first is None:
            return 0  # loaded already
        table = pq.ParquetFile(str(Path(folder) / rel_path))
        try:
            with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                for batch in table.iter_batches(batch_size=FETCH_ROWS):
                    columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
                    for row in zip(*columns):
                        copy.write_row(row)
                    rows += batch.num_rows
        except psycopg.errors.UntranslatableCharacter as exc:
            raise ReplError(
                f"the subscriber database {conn.info.dbname!r} (encoding {conn.info.parameter_status('server_encoding')}) "
                f"cannot store a character of article {article.name!r} ({article.destination}): "
                f"{exc.diag.message_primary}. Use a subscriber database whose encoding holds the publisher's "
                f"characters (UTF8 holds them all)"
            ) from None
    return rows


# ---------------------------------------------------------------------- the agent
def _create_slot(pub_conninfo: str, slot: str, permanent: bool) -> tuple[psycopg.Connection, str, str]:
    """Create a logical slot with an exported snapshot.  The returned replication connection
    must stay open (and idle) while readers use the snapshot."""
    conn = connections.connect(pub_conninfo, "publisher", autocommit=True, replication="database")
    kind = "" if permanent else " TEMPORARY"
    row = conn.execute(
        sql.SQL("CREATE_REPLICATION_SLOT {}{} LOGICAL pgoutput (SNAPSHOT 'export')").format(
            sql.Identifier(slot), sql.SQL(kind)
        )
    ).fetchone()
    return conn, row[1], row[2]  # consistent point, snapshot name


def _check_slot_loss(
    dist: psycopg.Connection, topology: Topology, publication: str, slot: str, targets: list[str]
) -> None:
    """A missing slot for a publication that was already being read means changes were lost
    (the slot was dropped or invalidated): only reinitializing every subscription repairs that."""
    was_read = (
        dist.execute(
            "SELECT 1 FROM airflow_repl.logreader_state WHERE publication = %s "
            "UNION ALL SELECT 1 FROM airflow_repl.subscriptions WHERE publication = %s "
            "AND status = 'active'",
            (publication, publication),
        ).fetchone()
        is not None
    )
    dist.commit()
    everyone = {s.subscriber for s in topology.subscriptions_of(publication)}
    if was_read and not everyone <= set(targets):
        raise ReplError(
            f"the replication slot {slot!r} of publication {publication!r} is missing at the publisher (dropped "
            f"or invalidated), so changes made since it was last read are lost for its subscriptions: run the "
            f"Snapshot Agent with reinitialize for every subscription of the publication"
        )


def _named_subscribers(topology: Topology, publication: str, subscribers: list[str] | None) -> list[str]:
    """The subscriptions the run is about; an unknown one is an error before anything changes."""
    names = subscribers or [s.subscriber for s in topology.subscriptions_of(publication)]
    for name in names:
        topology.subscription(publication, name)  # unknown subscription -> error
    return names


def _pending_subscribers(
    dist: psycopg.Connection, publication: str, names: list[str], reinitialize: bool, current_hash: str
) -> list[str]:
    if reinitialize:
        return names
    active = dict(
        dist.execute(
            "SELECT subscriber, articles_hash FROM airflow_repl.subscriptions WHERE publication = %s "
            "AND status = 'active'",
            (publication,),
        ).fetchall()
    )
    changed = sorted(n for n, h in active.items() if n in names and h is not None and h != current_hash)
    if changed:
        raise ReplError(
            f"the articles of publication {publication!r} changed since subscriber(s) "
            f"{', '.join(changed)} were initialized: run the Snapshot Agent with reinitialize for them"
        )
    return [n for n in names if n not in active]


def check_snapshot_folder(folder: Path) -> None:
    """The snapshot folder must be a directory this process can write (checked before the
    publication's slot is created, so that an unusable folder changes nothing)."""
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent  # the folder is made later: probe what exists of it now
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, f"{existing} is not a directory")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ReplError(
            f"snapshot folder {folder} cannot be written ({exc.strerror or exc}): set snapshot_folder "
            f"to a writable directory"
        ) from None


def _precheck_custom_procedures(
    run: AgentRun, topology: Topology, publication: str, names: list[str], reinitialize: bool, dist: psycopg.Connection
) -> None:
    """Custom procedures must exist at every subscription about to be initialized: checked
    before the topology is applied, so that a rejection leaves nothing half-made."""
    pub_conn = run.connect(topology.publisher.require("publisher"), "publisher")
    with pub_conn:
        articles = deploy.resolve_publication(pub_conn, topology.publication(publication))
    if not any(prop.method == "proc" and prop.custom for a in articles for prop in a.propagation.values()):
        return
    active: set[str] = set()
    if not reinitialize and dist.execute("SELECT to_regclass('airflow_repl.subscriptions') IS NOT NULL").fetchone()[0]:
        active = {
            r[0]
            for r in dist.execute(
                "SELECT subscriber FROM airflow_repl.subscriptions WHERE publication = %s AND status = 'active'",
                (publication,),
            )
        }
    dist.commit()
    for name in names:
        if name not in active:
            with run.connect(topology.subscriber_conninfo(name), f"subscriber {name!r}") as sub:
                _check_custom_procedures(sub, articles, name)


def run_snapshot(
    topology: Topology,
    publication: str,
    spark,
    *,
    subscribers: list[str] | None = None,
    reinitialize: bool = False,
    max_partitions: int | None = None,
) -> dict:
    """Snapshot ``publication`` and initialize its subscriptions that need it (all named ones
    with ``reinitialize``).  Returns a summary."""
    started = time.monotonic()
    names = _named_subscribers(topology, publication, subscribers)
    check_snapshot_folder(Path(topology.snapshot_folder) / publication)
    pub_conninfo = topology.publisher.require("publisher")
    with AgentRun(AGENT, publication) as run:
        run.step = "connecting"
        dist = run.connect(topology.distributor.require("distributor"), "distributor")
        run.lock(dist)
        run.step = "the checks"
        _precheck_custom_procedures(run, topology, publication, names, reinitialize, dist)
        run.step = "applying the topology"
        articles = deploy.apply_topology(topology, [publication])[publication]
        targets = _pending_subscribers(dist, publication, names, reinitialize, definition_hash(articles))
        dist.commit()
        run.begin(dist)
        slot = distdb.slot_name(dist, publication)
        with run.connect(pub_conninfo, "publisher", autocommit=True) as pub:
            has_slot = (
                pub.execute("SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
                is not None
            )
        if not has_slot:
            _check_slot_loss(dist, topology, publication, slot, targets)
        if has_slot and not targets:
            summary = {
                "snapshot_id": None,
                "initialized": [],
                "rows": 0,
                "message": "every subscription is already initialized; nothing to do",
            }
            return run.succeed(summary, message=summary["message"])
        run.step = "the checks of the subscribers' types"
        with run.connect(pub_conninfo, "publisher") as pub:  # refused before any slot exists
            _check_user_types(
                topology,
                targets,
                user_types.read(pub, articles).objects,
                lambda name, conninfo: run.connect(conninfo, f"subscriber {name!r}"),
            )
        snapshot_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)
        folder = Path(topology.snapshot_folder) / publication / snapshot_id
        folder.mkdir(parents=True, exist_ok=True)
        temp_slot = f"airflow_repl_snap_{secrets.token_hex(8)}"  # temporary: dropped with its connection
        run.step = "the creation of the replication slot"
        repl_conn, consistent_lsn, snapshot_name = _create_slot(
            pub_conninfo, temp_slot if has_slot else slot, permanent=not has_slot
        )
        run.track(repl_conn, "publisher", pub_conninfo)
        try:
            run.step = "the planning of the snapshot"
            parallelism = max_partitions or max(1, spark.sparkContext.defaultParallelism * 2)
            with run.connect(pub_conninfo, "publisher", autocommit=True) as planner:
                planner.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                planner.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
                tasks = [t for art in articles for t in plan_partitions(planner, art, parallelism)]
                needs = user_types.read(planner, articles)
                planner.execute("COMMIT")
            run.spark_step("the read of the snapshot", "publisher", pub_conninfo)
            read_started = time.monotonic()
            folder_s = str(folder)
            results = (
                spark.sparkContext.parallelize(tasks, len(tasks))
                .map(lambda t: read_partition(pub_conninfo, snapshot_name, folder_s, t))
                .collect()
            )
            read_seconds = time.monotonic() - read_started
        finally:
            repl_conn.close()  # ends the exported snapshot (and drops a temporary slot)
        run.step, run.spark_role = "the writing of the snapshot folder", None
        (folder / "schema.sql").write_text(
            user_types.script(needs.objects)
            + "\n".join(schema_script(a, needs.column_collations.get(a.name)) for a in articles)
        )
        (folder / "procedures.sql").write_text("\n".join(procedures.article_script(a) for a in articles))
        files = {a.name: [] for a in articles}
        for r in sorted(results, key=lambda r: r["path"]):
            files[r["article"]].append({"path": r["path"], "rows": r["rows"], "lower": r["lower"], "upper": r["upper"]})
        total_rows = sum(r["rows"] for r in results)
        manifest = {
            "snapshot_id": snapshot_id,
            "publication": publication,
            "consistent_lsn": consistent_lsn,
            "created_at": datetime.now(timezone.utc).isoformat(),
            "format": "parquet",
            "articles": [
                {
                    "name": a.name,
                    "source": a.table.qualified,
                    "destination": a.destination,
                    "columns": [{"name": c.name, "pg_type": c.type} for c in a.columns],
                    "primary_key": a.primary_key,
                    "files": files[a.name],
                    "rows": sum(f["rows"] for f in files[a.name]),
                }
                for a in articles
            ],
            "user_types": [o.to_dict() for o in needs.objects],
        }
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
        dist.execute(
            "INSERT INTO airflow_repl.snapshots (publication, snapshot_id, folder, consistent_lsn, "
            "manifest) VALUES (%s, %s, %s, %s, %s)",
            (publication, snapshot_id, str(folder), consistent_lsn, psycopg.types.json.Jsonb(manifest)),
        )
        dist.commit()
        load_stats = initialize_subscriptions(
            topology, publication, articles, targets, folder, manifest, spark, dist, run
        )
        summary = {
            "snapshot_id": snapshot_id,
            "folder": str(folder),
            "consistent_lsn": consistent_lsn,
            "rows": total_rows,
            "partitions": len(tasks),
            "initialized": targets,
            "read_seconds": round(read_seconds, 3),
            "rows_per_second": round(total_rows / read_seconds, 1) if read_seconds else None,
            **load_stats,
            "seconds": round(time.monotonic() - started, 3),
        }
        log.info(
            "snapshot %s of %s: %s rows in %s partitions, initialized %s",
            snapshot_id,
            publication,
            total_rows,
            len(tasks),
            targets,
        )
        return run.succeed(summary, rows_copied=total_rows)


def initialize_subscriptions(
    topology: Topology,
    publication: str,
    articles: list[ResolvedArticle],
    subscribers: list[str],
    folder: Path,
    manifest: dict,
    spark,
    dist: psycopg.Connection,
    run: AgentRun | None = None,
) -> dict:
    """Apply a snapshot folder to subscribers: tables, procedures, data (parallel COPY), then
    the watermark that makes the subscription active."""
    if not subscribers:
        return {"load_seconds": 0.0}
    started = time.monotonic()
    schema_sql = (folder / "schema.sql").read_text()
    procs_sql = (folder / "procedures.sql").read_text()
    conninfos = {s: topology.subscriber_conninfo(s) for s in subscribers}

    def connect(name: str, conninfo: str) -> psycopg.Connection:
        if run is None:
            return connections.connect(conninfo, f"subscriber {name!r}")
        run.step = f"the initialization of subscriber {name!r}"
        return run.connect(conninfo, f"subscriber {name!r}")

    _check_user_types(
        topology,
        subscribers,  # the snapshot's own types, at every subscriber first
        [user_types.UserObject.from_dict(o) for o in manifest.get("user_types", [])],
        connect,
    )
    for name, conninfo in conninfos.items():
        dist.execute(
            "UPDATE airflow_repl.subscriptions SET status = 'initializing', snapshot_id = %s "
            "WHERE publication = %s AND subscriber = %s",
            (manifest["snapshot_id"], publication, name),
        )
        dist.commit()
        with connect(name, conninfo) as sub:
            _check_custom_procedures(sub, articles, name)  # before anything is dropped
            sub.execute(subscriber_state.SUBSCRIBER_DDL)
            sub.execute("DELETE FROM airflow_repl.subscription_state WHERE publication = %s", (publication,))
            sub.execute("DELETE FROM airflow_repl.snapshot_files WHERE publication = %s", (publication,))
            sub.execute(schema_sql)
            if procs_sql.strip():
                sub.execute(procs_sql)
    by_name = {a.name: a.to_dict() for a in articles}
    folder_s, snapshot_id = str(folder), manifest["snapshot_id"]
    tasks = [
        (name, conninfos[name], f, art["name"])
        for name in subscribers
        for art in manifest["articles"]
        for f in art["files"]
    ]
    if tasks:
        if run is not None and len(subscribers) == 1:
            run.spark_step(
                f"the data load of subscriber {subscribers[0]!r}",
                f"subscriber {subscribers[0]!r}",
                conninfos[subscribers[0]],
            )
        elif run is not None:
            run.step = f"the data load of subscribers {', '.join(subscribers)}"
        spark.sparkContext.parallelize(tasks, len(tasks)).map(
            lambda t: load_file(t[1], folder_s, by_name[t[3]], t[2], snapshot_id)
        ).collect()
    if run is not None:
        run.spark_role = None
    for name, conninfo in conninfos.items():
        with connect(name, conninfo) as sub:
            _check_loaded_rows(sub, articles, manifest, name)
            for art in articles:
                sub.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(art.dest_schema, art.dest_table)))
            sub.execute(
                "INSERT INTO airflow_repl.subscription_state (publication, snapshot_id, xact_seqno) "
                "VALUES (%s, %s, %s::pg_lsn - 1)",
                (publication, manifest["snapshot_id"], manifest["consistent_lsn"]),
            )
        dist.execute(
            "UPDATE airflow_repl.subscriptions SET status = 'active', start_xact_seqno = %s::pg_lsn - 1, "
            "delivered_xact_seqno = %s::pg_lsn - 1, delivered_at = now(), articles_hash = %s "
            "WHERE publication = %s AND subscriber = %s",
            (manifest["consistent_lsn"], manifest["consistent_lsn"], definition_hash(articles), publication, name),
        )
        dist.commit()
    return {"load_seconds": round(time.monotonic() - started, 3)}


def _check_loaded_rows(
    sub: psycopg.Connection, articles: list[ResolvedArticle], manifest: dict, subscriber: str
) -> None:
    """Every article's subscriber table holds exactly the snapshot's rows, or the subscription
    is not activated (it stays 'initializing')."""
    expected = {a["name"]: a["rows"] for a in manifest["articles"]}
    for art in articles:
        rows = sub.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(art.dest_schema, art.dest_table))
        ).fetchone()[0]
        if rows != expected[art.name]:
            raise ReplError(
                f"subscriber {subscriber!r} holds {rows} rows in {art.destination} after loading the snapshot of "
                f"article {art.name!r}, which has {expected[art.name]}: the subscription was not activated; "
                f"check the subscriber table for triggers or rules that change rows, then run the Snapshot Agent "
                f"with reinitialize for it"
            )


def _check_user_types(
    topology: Topology,
    subscribers: list[str],
    objects: list[user_types.UserObject],
    connect: Callable[[str, str], psycopg.Connection],
) -> None:
    """Refuse, before any of them changes, subscribers whose types differ from the publisher's."""
    for name in subscribers:
        with connect(name, topology.subscriber_conninfo(name)) as sub:
            user_types.check(sub, objects, name)


def _check_custom_procedures(sub: psycopg.Connection, articles: list[ResolvedArticle], subscriber: str) -> None:
    for art in articles:
        for op, prop in art.propagation.items():
            if prop.method == "proc" and prop.custom:
                schema, name = art.procedure(op)
                params = call_syntax.parameters(art, op, prop.syntax)
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
                        f"{prop.syntax} syntax passes {len(params)}: "
                        f"{', '.join(f'{p} {t}' for p, t in params)}"
                    )
