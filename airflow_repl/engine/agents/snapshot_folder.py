"""The snapshot folder: what a snapshot of a publication is made of, and how each part is
written and loaded.

A snapshot folder (one per publication and run) holds ``schema.sql`` (each article's
pre-creation script, after the user types it needs), ``keys.sql`` (the tables' keys, added
after the load), ``procedures.sql``, Parquet data files
(``data/<article>-<hash>/part-NNNNN.parquet``, one per block range) and ``manifest.json``.

Owns: the block ranges (:func:`plan_partitions`, planned in the exported snapshot), reading one
range into a Parquet file while loading it into the subscribers being initialized, exactly once
each (:func:`read_partition`, run on Spark executors), and the scripts and manifest.
The Snapshot Agent (:mod:`~airflow_repl.engine.agents.snapshot_agent`) decides when each runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import math
import re
import tempfile
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import key_enforcement, procedures, user_types
from airflow_repl.engine.errors import ReplError, ServerLost
from airflow_repl.engine.model.topology import is_mariadb
from airflow_repl.engine.postgres import catalog, connections, raw_sql
from airflow_repl.engine.postgres.quoting import dollar_quote, ident, literal, qualified
from airflow_repl.engine.runtime import lifecycle
from airflow_repl.engine.state import subscriber_state

#: PostgreSQL types stored as typed Parquet columns; every other type is stored as its
#: PostgreSQL text form (exact for numeric, timestamps, arrays, json, ...) and typed by the manifest.
#: (The names of pyarrow's type factories: pyarrow is imported when the first file is written.)
ARROW_TYPES: dict[int, str] = {
    16: "bool_",
    20: "int64",
    21: "int16",
    23: "int32",
    700: "float32",
    701: "float64",
    25: "string",
    1043: "string",
    1042: "string",
    17: "binary",
}
#: Rows of one block range (one data file), roughly.
ROWS_PER_PARTITION = 50_000

#: What reading and writing the data files imports: pyarrow (with numpy), the readers' driver
#: and the COPY text maker, about a third of a copying process's imports.  A run imports them
#: when it has something to copy (:func:`import_file_modules`), not when the agent is imported.
FILE_MODULES = ("pyarrow.parquet", "airflow_repl.engine.postgres.arrow_reads", "airflow_repl.engine.postgres.copy_text")


def import_file_modules() -> None:
    """Import :data:`FILE_MODULES` (the read's tasks would import them otherwise, in each thread
    at once): called while a Spark application's JVM starts, so the import overlaps it.  A
    module missing from this Python environment is a :class:`ReplError` naming it."""
    for name in FILE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ReplError(
                f"the Snapshot Agent cannot import {exc.name or name!r}, which it reads and writes the snapshot's "
                f"data files with ({exc}): install airflow-repl with its dependencies (pyarrow, "
                f"adbc-driver-postgresql) in the Python environment that runs the agent"
            ) from None


class FileModulesImport:
    """:func:`import_file_modules` in a thread of its own, started once a run whose tasks run in
    threads of this process (no JVM start to overlap it) knows it copies: the import, mostly
    pyarrow's, overlaps the run's round trips (the checks, the slot, the plan, the subscribers'
    preparation) instead of following them.  :meth:`wait` joins it and raises its error, where
    the import would run otherwise.  The thread is a daemon: a run refused before it reads
    does not wait for the import."""

    def __init__(self) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._import, name="file-modules-import", daemon=True)
        self._thread.start()

    def _import(self) -> None:
        try:
            import_file_modules()
        except BaseException as exc:  # raised by wait(), in the run's thread
            self._error = exc

    def wait(self) -> None:
        """The modules imported (waits for the thread); its error if the import failed."""
        self._thread.join()
        if self._error is not None:
            raise self._error


#: One data file to read: the article (its definition), the file's index, its block range
#: (lower bound included, upper excluded; None: unbounded) and the article's estimated rows.
Partition = dict[str, Any]
#: One data file read: article, path (relative to the folder), rows, lower, upper.
DataFile = dict[str, Any]


# ---------------------------------------------------------------------- scripts and manifest
def schema_script(article: ResolvedArticle, collations: dict[str, str] | None = None) -> str:
    """DROP + CREATE of the subscriber table (SQL Server's pre-creation command 'drop'), without
    its keys: :func:`keys_script` adds them after the data load (one sorted index build instead
    of an index insertion per row); ``collations`` maps columns to their (quoted) collation
    where it is not their type's default.  Stored generated columns are created with the
    publisher's expression, in their place, unless they read a column the article filters out.
    A subscriber table that exists as a partitioned table is kept and emptied instead
    (:func:`_unless_partitioned`)."""
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
    table = qualified(article.dest_schema, article.dest_table)
    create = f"DROP TABLE IF EXISTS {table} CASCADE;\nCREATE TABLE {table} (\n" + ",\n".join(cols) + "\n);\n"
    return f"CREATE SCHEMA IF NOT EXISTS {ident(article.dest_schema)};\n" + _unless_partitioned(
        table, create, f"TRUNCATE {table};\n"
    )


def _unless_partitioned(table: str, statements: str, kept: str = "NULL;\n") -> str:
    """A DO block that runs ``statements`` on the subscriber table ``table`` (qualified and
    quoted), or ``kept`` when the table exists there as a partitioned table: the subscriber
    partitions its copy its own way (by another key or method than the publisher, if the
    publisher partitions the table at all), and keeps that table, its partitions and its keys
    through every (re)initialization."""
    body = (
        "BEGIN\nIF (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = "
        f"pg_catalog.to_regclass({literal(table)})) = 'p' THEN\n{kept}ELSE\n{statements}END IF;\nEND;\n"
    )
    return f"DO {dollar_quote(body)};\n"


def keys_script(article: ResolvedArticle) -> str:
    """The subscriber table's primary key and the publisher's unique keys it holds all columns
    of, as deferrable as at the publisher (DEFERRABLE ones checked ALWAYS, replicated changes
    included), added to the loaded table (not to a partitioned one the subscriber keeps, which
    has its own)."""
    keys = [("PRIMARY KEY", article.primary_key)] + [
        ("UNIQUE", key) for key in article.table.unique_keys if set(key) <= set(article.column_names)
    ]
    table = qualified(article.dest_schema, article.dest_table)
    deferrable = any(article.table.deferral(key) for _, key in keys)
    return _unless_partitioned(
        table,
        "".join(
            f"ALTER TABLE {table} ADD{_key_clause(kind, key, article.table.deferral(key))};\n" for kind, key in keys
        )
        + (key_enforcement.enforce_deferrable_keys_script(table) if deferrable else ""),
    )


def _key_clause(kind: str, key: list[str], deferral: str) -> str:
    """A PRIMARY KEY / UNIQUE table constraint, as deferrable as at the publisher."""
    return f" {kind} ({', '.join(ident(c) for c in key)}){' ' + deferral if deferral else ''}"


def _select_list(article: ResolvedArticle) -> sql.Composable:
    """The article's columns; those without an Arrow type as their type's output text, which is
    what pgoutput sends for later changes and what native replication copies.  Not ``::text``:
    a cast to text differs from the output function for some types (``xml`` keeps a default
    XML declaration that xml_out drops; ``inet`` adds ``/32``).  ``concat`` calls the output
    function (and NULL stays NULL through the CASE).  ``num_nulls`` asks whether the value
    itself is NULL: ``IS NULL`` is also true of a composite value whose fields are all NULL,
    ``(,,)``, which is not NULL and must arrive as it is."""
    parts = []
    for c in article.columns:
        col = sql.Identifier(c.name)
        parts.append(
            col
            if c.type_oid in ARROW_TYPES
            else sql.SQL("CASE WHEN pg_catalog.num_nulls({c}) = 1 THEN NULL ELSE pg_catalog.concat({c}) END").format(
                c=col
            )
        )
    return sql.SQL(", ").join(parts)


def arrow_schema(article: ResolvedArticle) -> Any:
    """The Parquet schema of an article's data files (``pa.Schema``)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(
                c.name,
                getattr(pa, ARROW_TYPES.get(c.type_oid, "string"))(),
                nullable=not c.not_null,
                metadata={"pg_type": c.type},
            )
            for c in article.columns
        ]
    )


# ---------------------------------------------------------------------- partitions
# A partition is a range of the table's heap blocks (TID range scan, PostgreSQL 14+), read
# inside the exported snapshot: every row version the snapshot sees lies in exactly one range
# (the last range is open, so blocks added since planning are read too), whatever the key's
# type or collation, and planning needs no sort of the keys.  The subscriber never evaluates a
# range: each file loads exactly once thanks to the ledger below.
def _filter(article: ResolvedArticle) -> sql.Composable:
    """The article's row filter (PostgreSQL's own deparsed, validated form), or true."""
    return sql.SQL("({})").format(sql.SQL(article.row_filter)) if article.row_filter else sql.SQL("true")


def plan_partitions(conn: psycopg.Connection[Any], article: ResolvedArticle, max_parts: int) -> list[Partition]:
    """Block ranges of equal size, one per ``ROWS_PER_PARTITION`` rows (at most ``max_parts``),
    with the article's row count, computed inside the exported snapshot."""
    count = raw_sql.execute(
        conn, sql.SQL("SELECT count(*) FROM {} WHERE {}").format(article.source, _filter(article))
    ).fetchone()
    rows = int(count[0]) if count is not None else 0
    parts = max(1, min(max_parts, math.ceil(rows / ROWS_PER_PARTITION)))
    blocks = _blocks(conn, article) if parts > 1 else 0
    edges: list[int | None] = [None, *(blocks * i // parts for i in range(1, parts)), None]
    return [
        {"article": article.to_dict(), "index": i, "lower": edges[i], "upper": edges[i + 1], "estimated_rows": rows}
        for i in range(len(edges) - 1)
    ]


def _blocks(conn: psycopg.Connection[Any], article: ResolvedArticle) -> int:
    """Heap blocks of the article's table, or of the largest of the tables it reads (its
    partitions, or the inheritance children it includes): each is scanned over the same block
    ranges, so the ranges' tasks read all of them in parallel."""
    name = sql.Identifier(article.table.schema, article.table.name).as_string(conn)
    return catalog.table_blocks(conn, name, article.include_children) or 0


def _folder_name(article: str) -> str:
    """A file-system-safe folder for an article's data files (article names may hold any character)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", article).strip(".") or "article"
    return f"{safe[:60]}-{hashlib.sha1(article.encode()).hexdigest()[:8]}"


def read_partition(
    conninfo: str,
    snapshot_name: str,
    folder: str,
    task: Partition,
    loads: Sequence[LoadTarget] = (),
    snapshot_id: str = "",
) -> DataFile:
    """Executor side: read one block range inside the exported snapshot into a Parquet file.  The
    rows arrive as Arrow columns (:mod:`~airflow_repl.engine.postgres.arrow_reads`: COPY binary
    decoded in C++), in batches, so memory stays bounded whatever the size of the range.

    ``loads``: subscribers being initialized from this snapshot (``snapshot_id``), each loaded
    with the same batches as they are written (one pass: the publisher's read, the file and the
    subscribers' COPY run together).  Each subscriber's load is one transaction that also enters
    the file in its ledger (:class:`_TableLoad`), committed once the file is complete: a task run
    again rewrites the file and skips the subscribers that hold it already."""
    import pyarrow.parquet as pq

    from airflow_repl.engine.postgres import arrow_reads, copy_text

    article = ResolvedArticle.from_dict(task["article"])
    query = sql.SQL("SELECT {} FROM {} WHERE {} AND {}").format(
        _select_list(article), article.source, _range_condition(task["lower"], task["upper"]), _filter(article)
    )
    rel = Path("data") / _folder_name(article.name) / f"part-{task['index']:05d}.parquet"
    path = Path(folder) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = arrow_schema(article)
    rows = 0
    what = f"article {article.name!r}"
    with contextlib.ExitStack() as subscribers:
        targets = [_table_load(subscribers, name, info, article, snapshot_id, str(rel)) for name, info in loads]
        targets = [t for t in targets if t.claimed]
        with (
            arrow_reads.snapshot_batches(conninfo, "publisher", snapshot_name, query.as_string(None), what) as batches,
            pq.ParquetWriter(str(path), schema) as writer,
        ):
            for batch in batches:
                typed = _as_schema(batch, schema)
                writer.write_batch(typed)
                text = None
                for target in targets:
                    if isinstance(target, _TableLoad):
                        if text is None:
                            text = copy_text.copy_text(typed)  # COPY text, made column by column in C++
                        target.write(text)
                    else:
                        target.write_batch(typed)  # another engine's load (mariadb_snapshot)
                rows += batch.num_rows
        for target in targets:  # the file is complete: every COPY ends, then every load commits
            target.end(rows)
        for target in targets:
            target.commit()
    return {"article": article.name, "path": str(rel), "rows": rows, "lower": task["lower"], "upper": task["upper"]}


#: A subscriber to load while reading: its name and connection string.
LoadTarget = tuple[str, str]


def _table_load(
    stack: contextlib.ExitStack, subscriber: str, conninfo: str, article: ResolvedArticle, snapshot_id: str, rel: str
) -> Any:
    """The load of one data file into one subscriber: COPY at PostgreSQL, multi-row INSERTs at
    MariaDB (:class:`~airflow_repl.engine.agents.mariadb_snapshot.TableLoad`)."""
    if is_mariadb(conninfo):
        from airflow_repl.engine.agents.mariadb_snapshot import TableLoad

        return TableLoad(stack, subscriber, conninfo, article, snapshot_id, rel)
    return _TableLoad(stack, subscriber, conninfo, article, snapshot_id, rel)


class _TableLoad:
    """One data file COPYed into one subscriber table, in one transaction that enters the file
    in the subscriber's ledger: exactly once (a concurrent attempt waits for the entry, then
    finds it: :attr:`claimed` is False).  :meth:`end` ends the COPY, :meth:`commit` commits; the connection is entered in
    ``stack``, which rolls back what is not committed when it closes on an error.  Errors name
    the subscriber: a lost connection, a character its encoding cannot hold."""

    def __init__(
        self,
        stack: contextlib.ExitStack,
        subscriber: str,
        conninfo: str,
        article: ResolvedArticle,
        snapshot_id: str,
        rel_path: str,
    ) -> None:
        self.article, self.snapshot_id, self.path, self.conninfo = article, snapshot_id, rel_path, conninfo
        self.role = f"subscriber {subscriber!r}"
        self.conn = stack.enter_context(connections.connect(conninfo, self.role))
        with self._errors():
            self.conn.execute("SET session_replication_role = replica")
            self.claimed = subscriber_state.claim_snapshot_file(
                self.conn, article.publication, snapshot_id, rel_path, 0
            )
        self._copying = contextlib.ExitStack()
        stack.enter_context(self._copying)  # an error ends the COPY before the rollback
        if self.claimed:
            copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
                sql.Identifier(article.dest_schema, article.dest_table),
                sql.SQL(", ").join(sql.Identifier(c) for c in article.column_names),
            )
            cursor = self._copying.enter_context(self.conn.cursor())
            self.copy = self._copying.enter_context(cursor.copy(copy_sql))

    def write(self, text: bytes | memoryview | str) -> None:
        with self._errors():
            self.copy.write(text)

    def end(self, rows: int) -> None:
        """End the COPY (where the server reports most errors) and count the file's rows in the ledger."""
        with self._errors():
            self._copying.close()
            subscriber_state.count_snapshot_file(self.conn, self.article.publication, self.snapshot_id, self.path, rows)

    def commit(self) -> None:
        with self._errors():
            self.conn.commit()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            if lifecycle.is_connection_loss(exc):  # named here: the task's other server is the publisher
                raise ServerLost(f"lost connection to the {self.role} ({lifecycle.host_port(self.conninfo)})") from None
            if not isinstance(exc, psycopg.errors.UntranslatableCharacter):
                raise
            conn = self.conn
            raise ReplError(
                f"the database {conn.info.dbname!r} of the {self.role} (encoding "
                f"{conn.info.parameter_status('server_encoding')}) cannot store a character of article "
                f"{self.article.name!r} ({self.article.destination}): {exc.diag.message_primary}. Use a subscriber "
                f"database whose encoding holds the publisher's characters (UTF8 holds them all)"
            ) from None


def _as_schema(batch: Any, schema: Any) -> Any:
    """A batch read from the publisher with the data files' schema (the field names, nullability
    and ``pg_type`` metadata of :func:`arrow_schema`; a column the driver typed otherwise, e.g. a
    domain over a typed type, is cast)."""
    columns = [
        col if col.type == field.type else col.cast(field.type)
        for col, field in zip(batch.columns, schema, strict=True)
    ]
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _range_condition(lower: int | None, upper: int | None) -> sql.Composable:
    """Rows whose heap block is in [``lower``, ``upper``) (None: unbounded)."""
    where = []
    if lower is not None:
        where.append(sql.SQL("ctid >= {}::pg_catalog.tid").format(sql.Literal(f"({int(lower)},0)")))
    if upper is not None:
        where.append(sql.SQL("ctid < {}::pg_catalog.tid").format(sql.Literal(f"({int(upper)},0)")))
    return sql.SQL(" AND ").join(where) if where else sql.SQL("true")


# ---------------------------------------------------------------------- the folder
def check_writable(folder: Path) -> None:
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


def write_scripts(folder: Path, articles: list[ResolvedArticle], needs: user_types.Requirements) -> None:
    """``schema.sql`` (the user types the articles need, then each article's table),
    ``keys.sql`` (each table's keys, run after the data load) and ``procedures.sql`` (the
    generated procedures)."""
    (folder / "schema.sql").write_text(
        user_types.script(needs.objects)
        + "\n".join(schema_script(a, needs.column_collations.get(a.name)) for a in articles)
    )
    (folder / "keys.sql").write_text("".join(keys_script(a) for a in articles))
    (folder / "procedures.sql").write_text("\n".join(procedures.article_script(a) for a in articles))


def write_manifest(
    folder: Path,
    snapshot_id: str,
    publication: str,
    consistent_lsn: str,
    articles: list[ResolvedArticle],
    files: list[DataFile],
    objects: list[user_types.UserObject],
) -> dict[str, Any]:
    """``manifest.json``: what the folder holds, for loading it; returns it."""
    by_article: dict[str, list[DataFile]] = {a.name: [] for a in articles}
    for f in sorted(files, key=lambda f: str(f["path"])):
        by_article[f["article"]].append(
            {"path": f["path"], "rows": f["rows"], "lower": f["lower"], "upper": f["upper"]}
        )
    manifest = {
        "snapshot_id": snapshot_id,
        "publication": publication,
        "consistent_lsn": consistent_lsn,
        "created_at": datetime.now(timezone.utc).isoformat(),
        "format": "parquet",
        "articles": [_manifest_article(a, by_article[a.name]) for a in articles],
        "user_types": [o.to_dict() for o in objects],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _manifest_article(article: ResolvedArticle, files: list[DataFile]) -> dict[str, Any]:
    return {
        "name": article.name,
        "source": article.table.qualified,
        "destination": article.destination,
        "columns": [{"name": c.name, "pg_type": c.type} for c in article.columns],
        "primary_key": article.primary_key,
        "files": files,
        "rows": sum(f["rows"] for f in files),
    }
