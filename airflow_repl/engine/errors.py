"""Errors raised by the replication engine.

Every message names the object at fault and, where there is one, the fix.  Each class carries the
command line's exit code and whether running the agent again (an Airflow retry) can fix it:

===========================  =====  =========  ==============================================
class                        exit   retryable  meaning
===========================  =====  =========  ==============================================
(usage error)                64     no         the command line itself: unknown option, bad value
ReplError / TopologyError    2      no         bad input: topology file, options, arguments
NotInitialized               3      no         run the Snapshot Agent (or apply) first
DeliveryError                4      no         a command cannot be applied at a subscriber
ConnectionFailed             5      yes        a server cannot be reached
ConnectionLost               5      yes        a server went away during a run
ServerLost                   5      yes        the same, found by a task that names the server
AgentBusy                    5      yes        another agent of the same kind is running
DifferencesFound             6      no         ``validate`` found rows that differ
SubscribersFailed            1-6    (some)     a run over several subscribers in which some
                                               failed: the most serious of their codes
HealthCheckFailed            1, 2   no         ``status --check``: a warning (1), a critical breach (2)
(anything else)              1      no         an internal error: a bug to report
===========================  =====  =========  ==============================================

The most serious of several exit codes (:func:`most_serious`) is the lowest non-zero one: an
internal error (1) before bad input (2), before not initialized (3), before a delivery error (4),
before the retryable failures (5), before differences found (6).  A run is thus retryable (5)
only when a retry can fix every subscriber that failed.

Messages built from a driver's exception pass through :func:`redact` before they leave the
engine or reach a screen, a history row or a log: the password of any connection string or URI
in them becomes ``***``.

An agent run that ends with one of these records its history row with the class's ``outcome``:
``blocked`` for a refusal the operator must act on (the message names the fix), ``failed`` for an
error (a delivery that failed, a server that cannot be reached, anything unexpected).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: SQLSTATE raised by generated update/delete procedures when no row matched the key
#: (SQL Server's error 20598, "The row was not found at the Subscriber").
ROW_NOT_FOUND_SQLSTATE = "RP598"

#: Exit code of an unexpected (internal) error.
INTERNAL_EXIT_CODE = 1

#: Exit code of a command-line usage error (sysexits.h's EX_USAGE): the command line alone is wrong.
USAGE_EXIT_CODE = 64


class ReplError(Exception):
    """Base class of every error the engine raises on purpose."""

    exit_code = 2
    retryable = False
    #: the history row's status of an agent run that ends with this error
    outcome = "blocked"


class TopologyError(ReplError):
    """The topology file or object is invalid (unknown table, missing primary key, ...)."""


class NotInitialized(ReplError):
    """An agent was asked to work on a subscription or publication that has no snapshot yet."""

    exit_code = 3


class DeliveryError(ReplError):
    """The Distribution Agent could not apply a command at a subscriber."""

    exit_code = 4
    outcome = "failed"

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        xact_seqno: str | None = None,
        command_id: int | None = None,
        article: str | None = None,
        command: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.xact_seqno = xact_seqno
        self.command_id = command_id
        self.article = article
        self.command = command  # the failing command, as stored (Command.to_json)


class ConnectionFailed(ReplError):
    """A server named in the topology cannot be reached."""

    exit_code = 5
    retryable = True
    outcome = "failed"


class ConnectionLost(ReplError):
    """A server went away (crash, restart, network) while an agent was using it."""

    exit_code = 5
    retryable = True
    outcome = "failed"


class ServerLost(ConnectionLost):
    """A task of a run lost the server it names (the run adds its step and what became of it)."""


class AgentBusy(ReplError):
    """Another agent of the same kind holds the lock for this publication or subscription."""

    exit_code = 5
    retryable = True
    outcome = "failed"


class DifferencesFound(ReplError):
    """``validate`` compared a publication with its subscribers and found differences."""

    exit_code = 6


def most_serious(codes: Iterable[int]) -> int:
    """The most serious of exit codes: the lowest non-zero one (0 when there is none; see the
    module's documentation)."""
    return min((c for c in codes if c), default=0)


class SubscribersFailed(ReplError):
    """A run over several subscribers (each a Spark task) in which some failed while the others
    went on to the end.  ``failures``: each failed subscriber's outcome (``subscriber``,
    ``error_class``, ``exit_code``, ``retryable``, ``message``); ``summary``: the run's result,
    every subscriber's entry included.  The exit code is the most serious of theirs, and the
    run is retryable only when every failure is; the message has one line per failure."""

    def __init__(self, summary: dict[str, Any], failures: list[dict[str, Any]]) -> None:
        self.summary, self.failures = summary, failures
        self.exit_code = most_serious(int(f["exit_code"]) for f in failures)
        self.retryable = all(f.get("retryable") for f in failures)
        super().__init__("\n".join(failure_line(f) for f in failures))


def failure_line(failure: dict[str, Any]) -> str:
    """One failed subscriber's line: ``subscriber 's2': <the first line of its message>``."""
    message = str(failure.get("message") or failure.get("error_class") or "failed").strip()
    return f"subscriber {failure['subscriber']!r}: {message.splitlines()[0]}"


class HealthCheckFailed(ReplError):
    """``status --check`` found a threshold reached: exit 1 for a warning, 2 for a critical one."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


_SECRET_PATTERNS = (
    re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE),
    re.compile(r"(://[^:/@\s]*:)[^@\s]*(@)"),
)


def redact(text: str, *secrets: str) -> str:
    """``text`` with passwords of connection strings and URIs, and each of ``secrets`` (a
    password the caller knows, as given or percent-encoded), replaced by ``***`` (a last line of
    defence for messages built from foreign exceptions)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    text = _SECRET_PATTERNS[0].sub(r"\1***", text)
    return _SECRET_PATTERNS[1].sub(r"\1***\2", text)
