"""Scripts of updatable subscriptions: the row-version column and its trigger.

Every published table of a publication that allows updating (``allow_sync_tran`` or
``allow_queued_tran``) carries :data:`ROW_VERSION_COLUMN` (``msrepl_tran_version uuid NOT NULL
DEFAULT gen_random_uuid()``, SQL Server's name).  The BEFORE UPDATE trigger
:data:`ROW_VERSION_TRIGGER` gives a row a new version on every update.  Like every ordinary
trigger it does not fire under ``session_replication_role = replica``, the role the Distribution
Agent applies in, so a replicated row keeps the version it had at the publisher.

``airflow-repl apply`` runs :func:`table_row_version_script` on the publisher's tables; the
Snapshot Agent runs :func:`row_version_script` on the tables of updatable subscribers (their
column comes from the snapshot like any other article column: the script adds its default and
the trigger).  Both are idempotent.
"""

from __future__ import annotations

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.updating import ROW_VERSION_COLUMN
from airflow_repl.engine.postgres.quoting import dollar_quote, ident, qualified

__all__ = ["ROW_VERSION_COLUMN", "row_version_script", "table_row_version_script"]
#: Its type, as ``format_type`` writes it.
ROW_VERSION_TYPE = "uuid"
#: The BEFORE UPDATE trigger keeping it current.
ROW_VERSION_TRIGGER = "airflow_repl_tran_version"
#: The trigger's function: (schema, name).
ROW_VERSION_FUNCTION = ("airflow_repl", "tran_version")

_FUNCTION_BODY = f"BEGIN\n    NEW.{ident(ROW_VERSION_COLUMN)} := gen_random_uuid();\n    RETURN NEW;\nEND;\n"


def function_script() -> str:
    """The trigger function (in schema ``airflow_repl``, created if missing)."""
    schema, name = ROW_VERSION_FUNCTION
    return (
        f"CREATE SCHEMA IF NOT EXISTS {ident(schema)};\n"
        f"CREATE OR REPLACE FUNCTION {qualified(schema, name)}() RETURNS trigger LANGUAGE plpgsql AS "
        f"{dollar_quote(_FUNCTION_BODY)};\n"
    )


def trigger_script(schema: str, table: str) -> str:
    """(Re)create the BEFORE UPDATE trigger on ``schema.table`` (the function must exist)."""
    target = qualified(schema, table)
    return (
        f"DROP TRIGGER IF EXISTS {ident(ROW_VERSION_TRIGGER)} ON {target};\n"
        f"CREATE TRIGGER {ident(ROW_VERSION_TRIGGER)} BEFORE UPDATE ON {target} FOR EACH ROW "
        f"EXECUTE FUNCTION {qualified(*ROW_VERSION_FUNCTION)}();\n"
    )


def column_script(schema: str, table: str) -> str:
    """Add the row-version column as the table's last column when it is missing, and make sure
    it has its default.  Adding it rewrites the table (a volatile default), under an ACCESS
    EXCLUSIVE lock."""
    target, column = qualified(schema, table), ident(ROW_VERSION_COLUMN)
    return (
        f"ALTER TABLE {target} ADD COLUMN IF NOT EXISTS {column} {ROW_VERSION_TYPE} NOT NULL "
        f"DEFAULT gen_random_uuid();\n"
        f"ALTER TABLE {target} ALTER COLUMN {column} SET DEFAULT gen_random_uuid();\n"
    )


def table_row_version_script(schema: str, table: str) -> str:
    """Column, default, function and trigger for one table (at the publisher)."""
    return column_script(schema, table) + function_script() + trigger_script(schema, table)


def row_version_script(article: ResolvedArticle) -> str:
    """Column default, function and trigger for an article's table at an updatable subscriber
    (the snapshot's schema script created the table with the column)."""
    return table_row_version_script(article.dest_schema, article.dest_table)
