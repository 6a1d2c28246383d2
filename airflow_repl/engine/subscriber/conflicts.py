"""Conflicts: what a command that failed to apply at a subscriber means for its transaction, and
what a queued subscriber change that meets a changed publisher row means (updatable subscriptions).

Queued updating (pure functions, no server): :func:`classify` names the conflict a queued
command meets from the row versions (``msrepl_tran_version``) and the publisher's row at its
key; :func:`decide` resolves a queued transaction's conflicts by the publication's policy;
:func:`sub_wins_action` says what "subscriber wins" does at the publisher for each kind.

Delivery: :func:`resolve`: a failure whose SQLSTATE the subscription's ``skip_errors`` names (a row
not found, a duplicate key) skips the command's transaction and is recorded as
:class:`Skipped`; any other failure stops delivery as a :class:`DeliveryError` naming the
command, with a hint for a row the subscriber is missing.  The apply loop
(:func:`~airflow_repl.engine.subscriber.applier.replay`) only rolls back to the transaction's
savepoint and asks here, so policies for more kinds of conflict belong in this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from airflow_repl.engine.articles.commands import Command
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE, DeliveryError
from airflow_repl.engine.model.propagation import TextEnum
from airflow_repl.engine.model.updating import ConflictPolicy

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
    ``airflow_repl.errors`` (:func:`~airflow_repl.engine.state.dist_history.record_error`)."""

    xact_seqno: str
    command_id: int
    article: str
    sqlstate: str | None
    command: dict[str, Any]
    message: str


def resolve(exc: psycopg.Error, at: FailedCommand, skip: set[str]) -> Skipped | DeliveryError:
    """Skip the transaction when ``exc``'s SQLSTATE is one of ``skip``; otherwise the error
    that stops delivery."""
    return resolve_failure(exc.sqlstate, exc.diag.message_primary or str(exc), at, skip)


def resolve_failure(sqlstate: str | None, diag: str, at: FailedCommand, skip: set[str]) -> Skipped | DeliveryError:
    """:func:`resolve` of a failure given as its SQLSTATE and message (a subscriber on another
    engine reports its errors in PostgreSQL's SQLSTATEs: ``RP598`` row not found, ``23505``
    duplicate key)."""
    if sqlstate in skip:
        return Skipped(
            xact_seqno=at.xact,
            command_id=at.command_id,
            article=at.command.article,
            sqlstate=sqlstate,
            command=at.command.to_json(),
            message=f"skipped transaction {at.xact}: cannot apply {at.description} (command {at.command_id}): {diag}",
        )
    hint = _ROW_NOT_FOUND_HINT if sqlstate == ROW_NOT_FOUND_SQLSTATE else ""
    return DeliveryError(
        f"cannot apply {at.description} in transaction {at.xact} (command {at.command_id}): {diag}.{hint}",
        sqlstate=sqlstate,
        xact_seqno=at.xact,
        command_id=at.command_id,
        article=at.command.article,
        command=at.command.to_json(),
    )


# ---------------------------------------------------------------------- queued updating
class ConflictKind(TextEnum):
    """How a queued subscriber change and the publisher's row disagree."""

    UPDATE_UPDATE = "update/update"  # the subscriber updated a row the publisher changed since
    UPDATE_DELETE = "update/delete"  # the subscriber updated a row the publisher does not have (deleted)
    DELETE_UPDATE = "delete/update"  # the subscriber deleted a row the publisher changed since
    INSERT_INSERT = "insert/insert"  # the subscriber inserted (or moved a row to) a key the publisher has
    ROW_MISSING = "row missing"  # the subscriber deleted a row the publisher does not have
    CONSTRAINT = "constraint violation"  # the publisher refused the change (unique key, check, not null)


@dataclass(frozen=True)
class PublisherRow:
    """What the publisher holds at a queued command's key: whether the row exists, and its
    row version."""

    exists: bool
    version: str | None = None


def classify(op: str, old_version: str | None, at_old_key: PublisherRow, new_key_taken: bool) -> ConflictKind | None:
    """The conflict a queued command meets, or None.  ``op`` is 'I', 'U' or 'D';
    ``old_version`` the row version the subscriber changed (U, D); ``at_old_key`` the
    publisher's row at the command's old key (U, D; ignored for I); ``new_key_taken`` whether
    the publisher has a row at the new key when the command inserts it or moves a row to it."""
    if op == "I":
        return ConflictKind.INSERT_INSERT if new_key_taken else None
    if op == "U":
        if not at_old_key.exists:
            return ConflictKind.UPDATE_DELETE
        if at_old_key.version != old_version:
            return ConflictKind.UPDATE_UPDATE
        return ConflictKind.INSERT_INSERT if new_key_taken else None
    if op == "D":
        if not at_old_key.exists:
            return ConflictKind.ROW_MISSING
        return ConflictKind.DELETE_UPDATE if at_old_key.version != old_version else None
    raise ValueError(f"unknown queued operation {op!r}")


def names_new_row(kind: ConflictKind, op: str) -> bool:
    """Whether a conflict's key is the queued command's new image's (else its old image's): the
    key the subscriber inserted or moved a row to (insert/insert), or the row the publisher
    refused as the subscriber has it (a constraint violation; for a delete, the row it deleted);
    the row the subscriber changed or deleted otherwise."""
    if kind is ConflictKind.INSERT_INSERT:
        return True
    return kind is ConflictKind.CONSTRAINT and op != "D"


class Resolution(TextEnum):
    """What became of a queued transaction (the ``outcome`` recorded with its conflicts)."""

    APPLIED = "applied"
    PUBLISHER_WINS = "publisher wins: the subscriber's transaction was not applied; the subscriber was compensated"
    SUBSCRIBER_WINS = (
        "subscriber wins: the subscriber's change overwrote the publisher's row (and is replicated back to the "
        "subscriber after the publisher's own change)"
    )
    KEY_UPDATE_NOT_SUPPORTED = (
        "not applied: subscriber wins does not support primary-key updates, so the publisher's row was kept "
        "and the subscriber compensated"
    )
    REFUSED = (
        "rejected: the publisher refused the subscriber's transaction (a constraint violation); the subscriber "
        "was compensated"
    )
    REINITIALIZE = (
        "publisher wins and reinitialize: the transaction and the rest of the queue were not applied; "
        "the subscription is marked for reinitialization"
    )

    @property
    def applied(self) -> bool:
        """The subscriber's changes are kept at the publisher."""
        return self in (Resolution.APPLIED, Resolution.SUBSCRIBER_WINS)

    @property
    def compensates(self) -> bool:
        """The subscriber's rows are brought back to the publisher's."""
        return self in (Resolution.PUBLISHER_WINS, Resolution.KEY_UPDATE_NOT_SUPPORTED, Resolution.REFUSED)

    @property
    def returns_to_origin(self) -> bool:
        """The applied transaction is replicated back to its subscriber too: a publisher change
        older than it, which it overwrote, may still be on its way there, and would otherwise
        leave the subscriber with the losing row."""
        return self is Resolution.SUBSCRIBER_WINS


@dataclass(frozen=True)
class Met:
    """A conflict met by one command of a queued transaction: its kind, and whether the
    command changes the row's primary key."""

    kind: ConflictKind
    key_changed: bool = False


def decide(policy: ConflictPolicy, met: Sequence[Met]) -> Resolution:
    """Resolve a queued transaction's conflicts by the publication's policy: publisher wins
    rejects the transaction; subscriber wins keeps it, unless a conflicting command changes a
    primary key (not supported); publisher wins and reinitialize rejects it and stops the queue."""
    if not met:
        return Resolution.APPLIED
    if policy is ConflictPolicy.SUB_WINS:
        if any(m.key_changed for m in met):
            return Resolution.KEY_UPDATE_NOT_SUPPORTED
        return Resolution.SUBSCRIBER_WINS
    if policy is ConflictPolicy.SUB_REINIT:
        return Resolution.REINITIALIZE
    return Resolution.PUBLISHER_WINS


def stops_at_first(policy: ConflictPolicy) -> bool:
    """Is a transaction decided by its first conflict (it is rejected whatever follows)?"""
    return policy is not ConflictPolicy.SUB_WINS


class Action(TextEnum):
    """What applying a queued command does at the publisher."""

    INSERT = "insert"  # insert the new image
    UPDATE = "update"  # update the row at the old key to the new image
    OVERWRITE = "overwrite"  # update the row at the new key to the new image
    DELETE = "delete"  # delete the row at the old key
    NOTHING = "nothing"


def action(op: str, kind: ConflictKind | None) -> Action:
    """What to do at the publisher for a command applied as it is (no conflict) or under
    subscriber wins (the subscriber's image wins whatever the publisher holds)."""
    if op == "I":
        return Action.OVERWRITE if kind is ConflictKind.INSERT_INSERT else Action.INSERT
    if op == "U":
        return Action.INSERT if kind is ConflictKind.UPDATE_DELETE else Action.UPDATE
    if kind is ConflictKind.ROW_MISSING:
        return Action.NOTHING
    return Action.DELETE


# ---------------------------------------------------------------------- delivery to a queued subscriber
class DeliveryConflict(TextEnum):
    """How a publisher command the Distribution Agent delivers to a queued updating subscriber
    meets the subscriber's own changes."""

    QUEUED_ROW = "queued at the subscriber"  # the row has a change in the subscriber's queue
    TAKEN_ROW = "taken from the subscriber's queue"  # the row's own change, applied by the Queue Reader, comes later
    IMMEDIATE_ROW = "older than the subscriber's immediate change"  # the row's own immediate change comes later
    UPDATE_MISSING = "update of a missing row"  # the publisher's update found no row there
    DELETE_MISSING = "delete of a missing row"  # the publisher's delete found no row there
    DUPLICATE_KEY = "duplicate key"  # the publisher's insert (or key update) met a row there


class Convergence(TextEnum):
    """What the Distribution Agent did with such a command (the outcome recorded with it)."""

    KEPT = (
        "the subscriber's row was kept: its queued change is decided by the Queue Reader at the publisher, "
        "which brings the subscriber to the winning row (a row the command touched at a key without a queued "
        "change became the publisher's)"
    )
    PUBLISHERS_ROW = "the subscriber's row was set to the publisher's"
    SUPERSEDED = (
        "not applied: the subscriber's own immediate change of the row, committed at the publisher after this "
        "command, holds its effect already"
    )
    NOTHING = "nothing to do: the row is not at the subscriber"


def delivery_conflict(op: str, sqlstate: str | None) -> DeliveryConflict | None:
    """The conflict a failed command met at a queued subscriber (None: a failure that is not one
    of these, handled as at any subscriber).  ``op`` is the command's 'I', 'U' or 'D'."""
    if sqlstate == ROW_NOT_FOUND_SQLSTATE:
        return {"U": DeliveryConflict.UPDATE_MISSING, "D": DeliveryConflict.DELETE_MISSING}.get(op)
    if sqlstate == "23505" and op in ("I", "U"):
        return DeliveryConflict.DUPLICATE_KEY
    return None


def converge(kind: DeliveryConflict) -> Convergence:
    """What a queued subscriber's row becomes when a publisher command meets it, under every
    policy.  A row with a change still queued at the subscriber is kept: the Queue Reader
    decides it at the publisher by the policy (publisher wins: it compensates the subscriber with
    the publisher's current row; subscriber wins: the change overwrites the publisher and comes
    back); so is a row whose own change the Queue Reader applied at the publisher after the
    command (without a conflict: the publisher's commands of the row before it net to nothing),
    and one whose own immediate change committed at the publisher after it
    (:mod:`~airflow_repl.engine.subscriber.superseded`).
    Any other row becomes the publisher's (the command's after image): the Queue Reader
    has decided that row already, and the publisher's current row includes the command."""
    if kind is DeliveryConflict.IMMEDIATE_ROW:
        return Convergence.SUPERSEDED
    if kind in (DeliveryConflict.QUEUED_ROW, DeliveryConflict.TAKEN_ROW):
        return Convergence.KEPT
    if kind is DeliveryConflict.DELETE_MISSING:
        return Convergence.NOTHING
    return Convergence.PUBLISHERS_ROW
