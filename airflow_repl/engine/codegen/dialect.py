"""The one interface every SQL dialect the engine generates text in implements, and the
registry of those dialects (``airflow-repl script-procs --dialect NAME``).

A dialect is a module: :mod:`~airflow_repl.engine.codegen.procedures` (PL/pgSQL, for
PostgreSQL subscribers), :mod:`~airflow_repl.engine.codegen.tsql_script` (T-SQL, a script for
SQL Server subscribers) and :mod:`~airflow_repl.engine.codegen.mariadb` (MariaDB and MySQL
subscribers).  Each one quotes names, maps a column's PostgreSQL type to its own, writes the
generated procedures ``sp_MSins_`` / ``sp_MSupd_`` / ``sp_MSdel_`` of every call syntax, the
statement that calls a procedure (generated or custom) with a call syntax's parameters, and the
DDL of a replicated schema change; what a call syntax passes is the dialect-neutral
:mod:`~airflow_repl.engine.codegen.call_syntax`.  A fourth engine is one new module that
satisfies :class:`Dialect`, added to :func:`dialects`.
"""

from __future__ import annotations

from typing import Any, Protocol

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import DeliveryError, TopologyError
from airflow_repl.engine.model.propagation import Operation
from airflow_repl.engine.postgres.catalog import Column


class Dialect(Protocol):
    """What a dialect module provides (checked by mypy for each module in :func:`dialects`)."""

    #: Its ``--dialect`` value.
    NAME: str
    #: The server it is for, a key of :data:`~airflow_repl.engine.codegen.call_syntax.MAX_ARGUMENTS`.
    SERVER: str

    def quote(self, name: str) -> str:
        """``name`` as a quoted identifier of the dialect."""

    def column_type(self, column: Column) -> str:
        """The dialect's type of a procedure parameter carrying ``column``'s values."""

    def check_names(self, article: ResolvedArticle) -> None:
        """Refuse (TopologyError, one line naming the article, the name and the fix) an article
        with a name the dialect's scripts cannot hold safely; nothing is generated for it."""

    def procedure_sql(self, article: ResolvedArticle, operation: Operation) -> str | None:
        """The statement creating the generated procedure of ``operation`` (one statement, as a
        driver sends it), or None when the operation uses no generated procedure."""

    def call_sql(self, article: ResolvedArticle, operation: Operation) -> str:
        """The statement calling the procedure ``operation`` uses (generated or custom) with
        its call syntax's parameters, as placeholders the dialect's driver binds in order."""

    def schema_change_sql(self, before: ResolvedArticle, change: dict[str, Any]) -> list[str]:
        """The statements changing the destination table for a replicated schema change
        (``change`` as the schema-change command carries it; none when the changed column is
        not in the article)."""

    def publication_script(self, articles: list[ResolvedArticle]) -> str:
        """Every article's generated procedures as one script for the dialect's own client,
        each article under a one-line comment naming it (``airflow-repl script-procs``)."""


def dialects() -> dict[str, Dialect]:
    """Every dialect, by ``--dialect`` value, in the order ``--help`` lists them."""
    from airflow_repl.engine.codegen import mariadb, procedures, tsql_script

    modules: list[Dialect] = [procedures, tsql_script, mariadb]
    return {module.NAME: module for module in modules}


def dialect(name: str) -> Dialect:
    """The dialect called ``name`` (TopologyError naming the known ones otherwise)."""
    known = dialects()
    if name not in known:
        raise TopologyError(f"unknown dialect {name!r}; choose one of {', '.join(known)}")
    return known[name]


#: The schema changes a dialect's :meth:`Dialect.schema_change_sql` renders (``change["kind"]``).
SCHEMA_CHANGES = ("add_column", "drop_column", "rename_column", "alter_type")


def schema_change_kind(before: ResolvedArticle, change: dict[str, Any]) -> str | None:
    """The kind of a replicated schema change a dialect renders: None when the changed column is
    not in the article (nothing changes at the subscriber); DeliveryError for a kind this version
    does not know."""
    if not change.get("in_article"):
        return None
    kind: str = change["kind"]
    if kind not in SCHEMA_CHANGES:
        raise DeliveryError(f"schema change {kind!r} of article {before.name!r} is not known to this version")
    return kind
