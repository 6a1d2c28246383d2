"""Updatable subscriptions: a publication's conflict policy and a subscription's update mode,
with SQL Server's spellings (``sp_addpublication @conflict_policy``, ``sp_addsubscription
@update_mode``).

Parsing is case-insensitive, ignores surrounding and repeated blanks, and accepts the long forms
of the policies (``publisher wins``, ``subscriber wins``, ``publisher wins and reinitialize``).
"""

from __future__ import annotations

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model.propagation import TextEnum

#: The row-version column every published table of an updatable publication carries (SQL
#: Server's name); see :mod:`airflow_repl.engine.codegen.updating_scripts`.
ROW_VERSION_COLUMN = "msrepl_tran_version"


class ConflictPolicy(TextEnum):
    """How the Queue Reader resolves a conflict between a queued change and the publisher."""

    PUB_WINS = "pub wins"
    SUB_WINS = "sub wins"
    SUB_REINIT = "sub reinit"

    @property
    def long_name(self) -> str:
        """``publisher wins``, ``subscriber wins`` or ``publisher wins and reinitialize``."""
        return _POLICY_LONG_NAMES[self]


class UpdateMode(TextEnum):
    """How a subscription's own changes reach the publisher (read only: they do not)."""

    READ_ONLY = "read only"
    SYNC_TRAN = "sync tran"
    QUEUED_TRAN = "queued tran"
    FAILOVER = "failover"
    QUEUED_FAILOVER = "queued failover"

    @property
    def queued(self) -> bool:
        """Changes are queued at the subscriber and applied by the Queue Reader."""
        return self in (UpdateMode.QUEUED_TRAN, UpdateMode.QUEUED_FAILOVER)

    @property
    def immediate(self) -> bool:
        """Changes are applied at the publisher in the subscriber's transaction (two-phase commit)."""
        return self in (UpdateMode.SYNC_TRAN, UpdateMode.FAILOVER)

    @property
    def updatable(self) -> bool:
        """Any mode but read only."""
        return self is not UpdateMode.READ_ONLY

    @property
    def failover(self) -> bool:
        """The subscription may switch between immediate and queued (``set-update-mode``)."""
        return self in (UpdateMode.FAILOVER, UpdateMode.QUEUED_FAILOVER)

    @property
    def needs_sync_tran(self) -> bool:
        """The publication must allow immediate updating (``allow_sync_tran``)."""
        return self.immediate or self.failover

    @property
    def needs_queued_tran(self) -> bool:
        """The publication must allow queued updating (``allow_queued_tran``)."""
        return self.queued or self.failover


_POLICY_LONG_NAMES = {
    ConflictPolicy.PUB_WINS: "publisher wins",
    ConflictPolicy.SUB_WINS: "subscriber wins",
    ConflictPolicy.SUB_REINIT: "publisher wins and reinitialize",
}
_POLICIES = {
    **{policy.value: policy for policy in ConflictPolicy},
    **{name: policy for policy, name in _POLICY_LONG_NAMES.items()},
}
_MODES = {mode.value: mode for mode in UpdateMode}


def _words(value: str) -> str:
    return " ".join(value.split()).lower()


def parse_conflict_policy(value: object) -> ConflictPolicy:
    """``pub wins``/``publisher wins``, ``sub wins``/``subscriber wins``, ``sub reinit``/``publisher
    wins and reinitialize`` (any case) -> :class:`ConflictPolicy`; anything else is an error
    naming the choices."""
    if isinstance(value, ConflictPolicy):
        return value
    policy = _POLICIES.get(_words(value)) if isinstance(value, str) else None
    if policy is None:
        choices = ", ".join(f"{p.value!r} ({p.long_name})" for p in ConflictPolicy)
        raise TopologyError(f"conflict_policy {value!r} is not a conflict policy; choose one of {choices}")
    return policy


def parse_update_mode(value: object) -> UpdateMode:
    """``read only``, ``sync tran``, ``queued tran``, ``failover`` or ``queued failover`` (any
    case) -> :class:`UpdateMode`; anything else is an error naming the choices."""
    if isinstance(value, UpdateMode):
        return value
    mode = _MODES.get(_words(value)) if isinstance(value, str) else None
    if mode is None:
        choices = ", ".join(repr(m.value) for m in UpdateMode)
        raise TopologyError(f"update_mode {value!r} is not an update mode; choose one of {choices}")
    return mode
