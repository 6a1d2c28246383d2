"""A replicated schema change (``airflow-repl schema-change``) at a MariaDB subscriber, in
commit order and exactly once although MariaDB's DDL is not transactional.

A transaction holding a schema change is delivered on its own (the Distribution Agent cuts its
batches there).  Its statements are computed first
(:func:`~airflow_repl.engine.codegen.mariadb.schema_change_sql`: a type the type map refuses
is one line naming the column, before anything changes).  Then, for each schema-change command
of the transaction:

1. the row changes before it are applied with the old columns, and committed together with the
   subscriber's progress through the transaction (``airflow_repl_schema_progress``: the last
   command applied), in one InnoDB transaction;
2. the ALTER TABLE runs (MariaDB commits it on its own);
3. the progress moves past the schema change, committed.

The row changes after the last schema change are applied with the new columns and committed
with the watermark past the transaction, which clears the progress.  A run that stops anywhere
resumes after the progress recorded; stopped between 2 and 3, it finds in the subscriber's
catalog (``information_schema``) that the column was already added, dropped or renamed and
only records the progress (a widening's ``MODIFY COLUMN`` is run again, which changes nothing);
the run's table check accepts the table as it was before that schema change or after it
(:func:`~airflow_repl.engine.state.dist_publications.definitions_partly_applied`), so a renamed
key column does not make it refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pymysql

from airflow_repl.engine.articles.commands import SCHEMA
from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.codegen import dialect
from airflow_repl.engine.codegen import mariadb as mariadb_dialect
from airflow_repl.engine.errors import DeliveryError
from airflow_repl.engine.mariadb import catalog, connections
from airflow_repl.engine.state import mariadb_subscriber_state as state
from airflow_repl.engine.subscriber import mariadb_apply, mariadb_calls
from airflow_repl.engine.subscriber.applier import Located
from airflow_repl.engine.subscriber.mariadb_apply import MariaDBApplier


@dataclass(frozen=True)
class Change:
    """One schema-change command of the transaction and its DDL at the subscriber."""

    before: ResolvedArticle
    after: ResolvedArticle
    change: dict[str, Any]
    statements: list[str]


def plan(located: list[Located]) -> dict[int, Change]:
    """The transaction's schema changes by command id, their DDL computed (a refusal raises
    before anything changes)."""
    out = {}
    for _, cid, cmd in located:
        if cmd.op == SCHEMA:
            assert cmd.schema is not None
            before = ResolvedArticle.from_dict(cmd.schema["before"])
            after = ResolvedArticle.from_dict(cmd.schema["after"])
            change = cmd.schema["change"]
            out[cid] = Change(before, after, change, mariadb_dialect.schema_change_sql(before, change))
    return out


def remaining(conn: Any, database: str, ch: Change) -> list[str]:
    """The statements of ``ch`` still to run, by the subscriber's catalog: none when the column
    is already added (but its temporary default's removal), dropped or renamed."""
    kind = dialect.schema_change_kind(ch.before, ch.change)
    if kind is None or kind == "alter_type":
        return ch.statements  # MODIFY COLUMN to the type it has changes nothing
    columns = {c.lower() for c in catalog.collations(conn, database, ch.before.dest_table)}
    column = str(ch.change["column"]).lower()
    if kind == "add_column":
        return ch.statements[1:] if column in columns else ch.statements
    if kind == "drop_column":
        return ch.statements if column in columns else []
    renamed = str(ch.change["new_name"]).lower()
    return [] if column not in columns and renamed in columns else ch.statements


def deliver(
    conn: Any,
    applier: MariaDBApplier,
    located: list[Located],
    xact: str,
    publication: str,
    subscriber: str,
    database: str,
) -> tuple[int, int]:
    """Apply transaction ``xact`` (``located``: its commands, with schema changes) at the
    subscriber as the module says; the last step (rows after the last change, watermark) is
    left for the caller to commit.  Returns (commands applied, schema changes applied)."""
    changes = plan(located)
    conn.rollback()
    state.ensure_tables(conn)  # a subscriber initialized before the progress table existed
    done = state.schema_progress(conn, publication, xact)
    segment: list[Located] = []
    n = applied = 0
    for x, cid, cmd in located:
        if cmd.op == SCHEMA:
            ch = changes[cid]
            if done is None or cid > done:
                n += _rows(conn, applier, segment)
                segment = []
                state.set_schema_progress(conn, publication, xact, cid - 1)
                conn.commit()
                _ddl(conn, remaining(conn, database, ch), ch, subscriber)
                _ddl(conn, mariadb_calls.procedure_statements([ch.after]), ch, subscriber)  # its procedures anew
                state.set_schema_progress(conn, publication, xact, cid)
                conn.commit()
                applied += 1
            applier.redefine(ch.after)
        elif done is None or cid > done:
            segment.append((x, cid, cmd))
    n += _rows(conn, applier, segment)
    state.set_watermark(conn, publication, xact, 1)
    state.set_articles_hash(conn, publication, articles_hash(applier))
    state.clear_schema_progress(conn, publication)
    return n, applied


def articles_hash(applier: MariaDBApplier) -> str:
    """The hash of the definitions the subscriber has now."""
    return definition_hash(list(applier.articles.values()))


def _rows(conn: Any, applier: MariaDBApplier, located: list[Located]) -> int:
    """Row changes command by command (never skipped: a failure stops delivery here)."""
    outcome = mariadb_apply.replay(conn, applier, located, set())
    if outcome.failure is not None:
        raise outcome.failure
    return outcome.commands


def _ddl(conn: Any, statements: list[str], ch: Change, subscriber: str) -> None:
    with conn.cursor() as cur:
        for stmt in statements:
            try:
                cur.execute(stmt)  # generated text, names quoted
            except pymysql.err.OperationalError as exc:
                if connections.is_lost(exc):
                    raise
                _refused(exc, ch, subscriber)
            except pymysql.MySQLError as exc:
                _refused(exc, ch, subscriber)


def _refused(exc: pymysql.MySQLError, ch: Change, subscriber: str) -> None:
    raise DeliveryError(
        f"the schema change of article {ch.before.name!r} failed at MariaDB subscriber {subscriber!r} "
        f"({ch.change.get('kind')} of column {ch.change.get('column')!r}): {connections.error_text(exc)}; fix the table "
        f"there and run the Distribution Agent again (it resumes at the schema change)",
        article=ch.before.name,
    ) from None
