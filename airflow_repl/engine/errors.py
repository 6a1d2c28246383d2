"""Errors raised by the replication engine.

Every message names the object at fault and, where there is one, the fix.
"""

from __future__ import annotations

#: SQLSTATE raised by generated update/delete procedures when no row matched the key
#: (SQL Server's error 20598, "The row was not found at the Subscriber").
ROW_NOT_FOUND_SQLSTATE = "RP598"


class ReplError(Exception):
    """Base class of every error the engine raises on purpose."""


class TopologyError(ReplError):
    """The topology file or object is invalid (unknown table, missing primary key, ...)."""


class ConnectionFailed(ReplError):
    """A server named in the topology cannot be reached."""


class NotInitialized(ReplError):
    """An agent was asked to work on a subscription or publication that has no snapshot yet."""


class DeliveryError(ReplError):
    """The Distribution Agent could not apply a command at a subscriber."""

    def __init__(self, message: str, *, sqlstate: str | None = None, xact_seqno: str | None = None,
                 command_id: int | None = None, article: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.xact_seqno = xact_seqno
        self.command_id = command_id
        self.article = article
