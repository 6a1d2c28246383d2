"""The Snapshot Agent's part at a MariaDB subscriber: its tables made by the type map, the
snapshot's rows loaded by the same Spark tasks that read them, its keys after the load, and its
watermark at the snapshot's consistent point (the exact hand-off to the Distribution Agent).

* :func:`plan_tables` (before anything changes): each article's ``CREATE TABLE`` from the type
  map (:mod:`~airflow_repl.engine.mariadb.types`), or a refusal naming the column and its type;
  names MariaDB cannot hold (more than 64 characters, a trailing space, columns equal but for
  case: MariaDB's column names are case-insensitive) are refused too.
* :func:`prepare`: the state tables, and every article's table dropped and created (InnoDB,
  utf8mb4, ``utf8mb4_nopad_bin``, with its primary key: InnoDB stores rows in key order).
* :class:`TableLoad`: one data file's rows as multi-row INSERTs, in one InnoDB transaction that
  enters the file in the subscriber's ledger: exactly once, however often a task runs.
* :func:`activate`: the unique keys added over the loaded rows, the row counts checked, the
  watermark started just before the consistent point.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import psycopg
import pymysql

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import ReplError, ServerLost, TopologyError
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.mariadb import types
from airflow_repl.engine.mariadb.quoting import check_name, ident, ident_in_format
from airflow_repl.engine.state import mariadb_subscriber_state as state
from airflow_repl.engine.subscriber import mariadb_apply, mariadb_calls, mariadb_streams

#: Rows per multi-row INSERT of the load (the driver also splits by the server's packet size).
INSERT_ROWS = 1000


@dataclass(frozen=True)
class TablePlan:
    """An article's table at a MariaDB subscriber: its creation and the keys added after the load."""

    article: str
    table: str
    create: str
    keys: list[str]


def user_type_kinds(pub: psycopg.Connection[Any], articles: list[ResolvedArticle]) -> dict[int, str]:
    """``pg_type.typtype`` of the articles' column types (``e`` enum, ``r`` range, ``c`` composite,
    ``d`` domain, ...), read at the publisher."""
    oids = sorted({c.type_oid for a in articles for c in a.columns})
    if not oids:
        return {}
    rows = pub.execute("SELECT oid::int8, typtype::text FROM pg_catalog.pg_type WHERE oid = ANY(%s)", (oids,))
    return {int(oid): str(kind) for oid, kind in rows}


def plan_tables(articles: list[ResolvedArticle], kinds: dict[int, str], subscriber: str) -> list[TablePlan]:
    """Each article's table at the MariaDB subscriber, or a refusal (nothing has changed yet)."""
    mariadb_calls.check_propagation(articles, subscriber)
    plans: list[TablePlan] = []
    tables: dict[str, str] = {}
    for art in articles:
        where = f"article {art.name!r} ({art.destination!r}) at MariaDB subscriber {subscriber!r}"
        table = check_name("table", art.dest_table, where)
        if table in tables:
            raise TopologyError(
                f"articles {tables[table]!r} and {art.name!r} both go to table {table!r} at MariaDB subscriber "
                f"{subscriber!r} (its tables live in one database, whatever their schema): give one another destination"
            )
        tables[table] = art.name
        names = art.column_names
        keys = set(art.key_positions)
        room = types.key_room(
            where,
            [
                [
                    types.key_part(
                        where,
                        names[i],
                        art.columns[i].base_type or art.columns[i].type,
                        "b" if art.columns[i].base_type else kinds.get(art.columns[i].type_oid, "b"),
                    )
                    for i in key
                ]
                for key in [art.pk_positions, *art.unique_positions]
            ],
        )
        seen: dict[str, str] = {}
        lines = []
        for i, col in enumerate(art.columns):
            check_name("column", col.name, where)
            if col.name.lower() in seen:
                raise TopologyError(
                    f"columns {seen[col.name.lower()]!r} and {col.name!r} of {where} differ only in case, which "
                    f"MariaDB's column names ignore: rename one at the publisher or leave it out of the article"
                )
            seen[col.name.lower()] = col.name
            kind = kinds.get(col.type_oid, "b")
            pg_type = col.base_type or col.type
            mapped = types.map_type(
                where,
                col.name,
                pg_type,
                key=i in keys,
                kind="b" if col.base_type else kind,
                key_bytes=room.get(col.name, types.KEY_BYTES),
            )
            null = " NOT NULL" if col.not_null or i in art.pk_positions else ""
            lines.append(f"{ident(col.name)} {mapped.ddl}{null}")
        lines.append(f"PRIMARY KEY ({', '.join(ident(names[i]) for i in art.pk_positions)})")
        create = (
            f"CREATE TABLE {ident(table)} ({', '.join(lines)}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 "
            f"COLLATE=utf8mb4_nopad_bin"
        )
        unique = [
            f"ALTER TABLE {ident(table)} ADD UNIQUE KEY ({', '.join(ident(names[i]) for i in positions)})"
            for positions in art.unique_positions
        ]
        plans.append(TablePlan(art.name, table, create, unique))
    return plans


def connect(conninfo: str, subscriber: str) -> Any:
    return mariadb_connections.connect(conninfo, f"MariaDB subscriber {subscriber!r}")


def prepare(conninfo: str, subscriber: str, publication: str, plans: list[TablePlan]) -> None:
    """The state tables (the publication's watermark and ledger forgotten), and every article's
    table dropped and created anew.  A multi-stream batch a killed Distribution Agent left
    prepared is finished first: its locks would hold the watermark row reset here."""
    conn = connect(conninfo, subscriber)
    try:
        mariadb_streams.recover_prepared(conn, mariadb_connections.database(conninfo), publication, subscriber, 1)
        state.reset_for_snapshot(conn, publication)
        conn.commit()
        with conn.cursor() as cur:
            for plan in plans:
                cur.execute(f"DROP TABLE IF EXISTS {ident(plan.table)}")
                cur.execute(plan.create)
    finally:
        conn.close()


def activate(
    conninfo: str, subscriber: str, publication: str, plans: list[TablePlan], manifest: dict[str, Any], snapshot_id: str
) -> None:
    """Unique keys over the loaded rows, the row counts checked, the watermark started."""
    expected = {a["name"]: a["rows"] for a in manifest["articles"]}
    conn = connect(conninfo, subscriber)
    try:
        with conn.cursor() as cur:
            for plan in plans:
                for key in plan.keys:
                    try:
                        cur.execute(key)
                    except pymysql.err.IntegrityError as exc:
                        raise ReplError(
                            f"the rows of publication {publication!r} break a unique key of table {plan.table!r} at "
                            f"MariaDB subscriber {subscriber!r}: {mariadb_connections.error_text(exc, conninfo)}; run the "
                            f"Snapshot Agent again"
                        ) from None
                cur.execute(f"SELECT COUNT(*) FROM {ident(plan.table)}")
                row = cur.fetchone()
                rows = int(row[0]) if row else None
                if rows != expected[plan.article]:
                    raise ReplError(
                        f"MariaDB subscriber {subscriber!r} holds {rows} rows in table {plan.table!r} after loading "
                        f"the snapshot of article {plan.article!r}, which has {expected[plan.article]}: the subscription "
                        f"was not activated; run the Snapshot Agent with reinitialize for it"
                    )
        conn.commit()
        state.start_watermark(conn, publication, snapshot_id, manifest["consistent_lsn"])
        conn.commit()
    finally:
        conn.close()


class TableLoad:
    """One data file loaded into one MariaDB table as multi-row INSERTs, in one InnoDB
    transaction that enters the file in the subscriber's ledger: exactly once (a concurrent or
    repeated attempt finds the entry: :attr:`claimed` is False).  The connection is closed by
    ``stack``, which rolls back what is not committed."""

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
        self.role = f"MariaDB subscriber {subscriber!r}"
        self.conn = mariadb_connections.connect(conninfo, self.role)
        stack.callback(self.conn.close)
        self.conversions = mariadb_apply.conversions(article)
        names = ", ".join(ident_in_format(n) for n in article.column_names)
        marks = ", ".join(["%s"] * len(article.columns))
        self.insert = f"INSERT INTO {ident_in_format(article.dest_table)} ({names}) VALUES ({marks})"
        self.where = f"article {article.name!r}"
        with self._errors():
            self.claimed = state.claim_snapshot_file(self.conn, article.publication, snapshot_id, rel_path)

    def write_batch(self, batch: Any) -> None:
        """Insert an Arrow record batch's rows."""
        columns = [col.to_pylist() for col in batch.columns]
        names = self.article.column_names
        rows = [
            [
                types.to_param(conv, v, name, self.where)
                for conv, v, name in zip(self.conversions, row, names, strict=True)
            ]
            for row in zip(*columns, strict=True)
        ]
        with self._errors(), self.conn.cursor() as cur:
            for start in range(0, len(rows), INSERT_ROWS):
                cur.executemany(self.insert, rows[start : start + INSERT_ROWS])

    def end(self, rows: int) -> None:
        with self._errors():
            state.count_snapshot_file(self.conn, self.article.publication, self.snapshot_id, self.path, rows)

    def commit(self) -> None:
        with self._errors():
            self.conn.commit()

    @contextlib.contextmanager
    def _errors(self) -> Any:
        try:
            yield
        except pymysql.MySQLError as exc:
            if mariadb_connections.is_lost(exc):
                raise ServerLost(
                    f"lost connection to the {self.role} ({mariadb_connections.describe(self.conninfo)})"
                ) from None
            raise ReplError(
                f"cannot load the snapshot of article {self.article.name!r} into the {self.role}: "
                f"{mariadb_connections.error_text(exc, self.conninfo)}"
            ) from None
