"""How one operation (insert, update, delete) of an article reaches subscribers.

The article options follow SQL Server's ``@ins_cmd`` / ``@upd_cmd`` / ``@del_cmd``:

=====================  ==========================================================
``CALL``, ``SCALL``,   the generated procedure (``sp_MSins_...``) with that syntax
``MCALL``, ``XCALL``
``XCALL my.proc``      a custom procedure, called with that syntax
``SQL``                a plain parameterised INSERT / UPDATE / DELETE statement
``NONE``               the operation is not replicated
=====================  ==========================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_repl.engine.errors import TopologyError

OPERATIONS = ("insert", "update", "delete")

#: Call syntaxes allowed for each operation (SPEC section 1).
ALLOWED_SYNTAX = {
    "insert": ("CALL",),
    "update": ("CALL", "SCALL", "MCALL", "XCALL"),
    "delete": ("CALL", "XCALL"),
}
DEFAULT_SYNTAX = {"insert": "CALL", "update": "SCALL", "delete": "CALL"}

_PROC_RE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_$]*\.)?[A-Za-z_][A-Za-z0-9_$]*$")


@dataclass(frozen=True)
class Propagation:
    operation: str
    method: str  # "proc", "sql" or "none"
    syntax: str | None = None
    procedure: str | None = None  # custom procedure name; None means the generated one

    @property
    def custom(self) -> bool:
        return self.procedure is not None

    @property
    def text(self) -> str:
        if self.method == "sql":
            return "SQL"
        if self.method == "none":
            return "NONE"
        return f"{self.syntax} {self.procedure}" if self.procedure else str(self.syntax)


def parse_propagation(operation: str, value: str | None, *, article: str = "?") -> Propagation:
    """Parse an ``ins_cmd``/``upd_cmd``/``del_cmd`` value, rejecting syntaxes the operation
    does not allow with the allowed choices in the message."""
    option = {"insert": "ins_cmd", "update": "upd_cmd", "delete": "del_cmd"}[operation]
    if value is None:
        return Propagation(operation, "proc", DEFAULT_SYNTAX[operation])
    if not isinstance(value, str) or not value.strip():
        raise TopologyError(
            f"{option} of article {article!r} must be a string such as {DEFAULT_SYNTAX[operation]!r}, 'SQL' or 'NONE'"
        )
    words = value.split()
    head = words[0].upper()
    allowed = ", ".join(ALLOWED_SYNTAX[operation])
    if head in ("SQL", "NONE"):
        if len(words) != 1:
            raise TopologyError(f"{option} {value!r} of article {article!r}: {head} takes no procedure name")
        return Propagation(operation, head.lower())
    if head == "VCALL":
        raise TopologyError(
            f"{option} {value!r} of article {article!r}: VCALL is reserved for updatable "
            f"subscriptions; choose one of {allowed}, SQL or NONE"
        )
    if head not in ("CALL", "SCALL", "MCALL", "XCALL"):
        raise TopologyError(
            f"{option} {value!r} of article {article!r} is not understood; use one of "
            f"{allowed} (optionally followed by a custom procedure name), SQL or NONE"
        )
    if head not in ALLOWED_SYNTAX[operation]:
        raise TopologyError(
            f"{option} of article {article!r}: {head} is not allowed for {operation}s; "
            f"allowed call syntaxes: {allowed} (or SQL / NONE)"
        )
    if len(words) > 2:
        raise TopologyError(f"{option} {value!r} of article {article!r}: expected '<SYNTAX> [procedure]'")
    proc = words[1] if len(words) == 2 else None
    if proc is not None and not _PROC_RE.match(proc):
        raise TopologyError(
            f"{option} of article {article!r}: {proc!r} is not a valid procedure name (use name or schema.name)"
        )
    return Propagation(operation, "proc", head, proc)
