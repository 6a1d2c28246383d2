"""The ``airflow_repl_queue`` triggers of a queued updating subscription: one per article
table at the subscriber, recording the application's row changes in the subscriber's queue.

Ordinary ``AFTER INSERT OR UPDATE OR DELETE ... FOR EACH ROW`` triggers calling
``airflow_repl.queue_capture(publication, article)`` (created with the queue, see
:mod:`~airflow_repl.engine.state.subscriber_state`): they run after the row-version trigger, so
the new image holds the new ``msrepl_tran_version``, and they do not fire under
``session_replication_role = replica``, the role of every replication write at the subscriber.
"""

from __future__ import annotations

from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle

TRIGGER = "airflow_repl_queue"


def _table(article: ResolvedArticle) -> sql.Identifier:
    return sql.Identifier(article.dest_schema, article.dest_table)


def install(article: ResolvedArticle) -> sql.Composed:
    """Create (or re-create) the article's queue trigger at the subscriber."""
    return sql.SQL(
        "DROP TRIGGER IF EXISTS {trigger} ON {table}; "
        "CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE OR DELETE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION airflow_repl.queue_capture({publication}, {article})"
    ).format(
        trigger=sql.Identifier(TRIGGER),
        table=_table(article),
        publication=sql.Literal(article.publication),
        article=sql.Literal(article.name),
    )


def drop(article: ResolvedArticle) -> sql.Composed:
    """Drop the article's queue trigger (a subscription that is no longer queued)."""
    return sql.SQL("DROP TRIGGER IF EXISTS {trigger} ON {table}").format(
        trigger=sql.Identifier(TRIGGER), table=_table(article)
    )
