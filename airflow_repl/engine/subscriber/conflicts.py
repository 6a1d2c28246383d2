"""Conflicts at a subscriber: what a command that failed to apply means for its transaction.

Owns :func:`resolve`: a failure whose SQLSTATE the subscription's ``skip_errors`` names (a row
not found, a duplicate key) skips the command's transaction and is recorded as
:class:`Skipped`; any other failure stops delivery as a :class:`DeliveryError` naming the
command, with a hint for a row the subscriber is missing.  The apply loop
(:func:`~airflow_repl.engine.subscriber.applier.replay`) only rolls back to the transaction's
savepoint and asks here, so policies for more kinds of conflict belong in this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from airflow_repl.engine.articles.commands import Command
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE, DeliveryError

_ROW_NOT_FOUND_HINT = (
    " The subscriber is missing a row the publisher had: repair the row, reinitialize "
    "the subscription (Snapshot Agent with reinitialize), or skip such errors with the "
    "subscription's skip_errors option."
)


@dataclass(frozen=True)
class FailedCommand:
    """The command that failed: its transaction, its id there, itself, and how to name it."""

    xact: str
    command_id: int
    command: Command
    description: str


@dataclass(frozen=True)
class Skipped:
    """A transaction skipped for a skippable error; the fields are those of its row in
    ``airflow_repl.errors`` (:func:`~airflow_repl.engine.state.distdb.record_error`)."""

    xact_seqno: str
    command_id: int
    article: str
    sqlstate: str | None
    command: dict[str, Any]
    message: str


def resolve(exc: psycopg.Error, at: FailedCommand, skip: set[str]) -> Skipped | DeliveryError:
    """Skip the transaction when ``exc``'s SQLSTATE is one of ``skip``; otherwise the error
    that stops delivery."""
    diag = exc.diag.message_primary or str(exc)
    if exc.sqlstate in skip:
        return Skipped(
            xact_seqno=at.xact,
            command_id=at.command_id,
            article=at.command.article,
            sqlstate=exc.sqlstate,
            command=at.command.to_json(),
            message=f"skipped transaction {at.xact}: cannot apply {at.description} (command {at.command_id}): {diag}",
        )
    hint = _ROW_NOT_FOUND_HINT if exc.sqlstate == ROW_NOT_FOUND_SQLSTATE else ""
    return DeliveryError(
        f"cannot apply {at.description} in transaction {at.xact} (command {at.command_id}): {diag}.{hint}",
        sqlstate=exc.sqlstate,
        xact_seqno=at.xact,
        command_id=at.command_id,
        article=at.command.article,
        command=at.command.to_json(),
    )
