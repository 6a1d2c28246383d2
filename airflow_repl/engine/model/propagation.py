"""How one operation (insert, update, delete) of an article reaches subscribers.

The article options follow SQL Server's ``@ins_cmd`` / ``@upd_cmd`` / ``@del_cmd``:

=====================  ==========================================================
``CALL``, ``SCALL``,   the generated procedure (``sp_MSins_...``) with that syntax
``MCALL``, ``XCALL``
``XCALL my.proc``      a custom procedure, called with that syntax
``SQL``                a plain parameterised INSERT / UPDATE / DELETE statement
``NONE``               the operation is not replicated
=====================  ==========================================================

The vocabulary is a set of string-valued enums (:class:`Operation`, :class:`Method`,
:class:`CallSyntax`): each member *is* its string, so members compare equal to the text stored in
the distribution database and in JSON, and format as that text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from airflow_repl.engine.errors import TopologyError


class TextEnum(str, Enum):
    """A string-valued enum whose members print as their value (``f"{Operation.INSERT}"`` is
    ``insert``), as :class:`enum.StrEnum` does from Python 3.11 on."""

    def __str__(self) -> str:
        return str(self.value)


class Operation(TextEnum):
    """A row operation an article replicates."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"

    @property
    def prefix(self) -> str:
        """``ins``, ``upd`` or ``del``: SQL Server's abbreviation (option and procedure names)."""
        return self.value[:3]

    @property
    def option(self) -> str:
        """The article option that sets how this operation propagates (``ins_cmd``, ...)."""
        return f"{self.prefix}_cmd"


class Method(TextEnum):
    """How an operation propagates: a procedure call, a plain SQL statement, or not at all."""

    PROC = "proc"
    SQL = "sql"
    NONE = "none"


class CallSyntax(TextEnum):
    """Which parameters a procedure receives (SQL Server's call syntaxes, SPEC section 1)."""

    CALL = "CALL"
    SCALL = "SCALL"
    MCALL = "MCALL"
    XCALL = "XCALL"


OPERATIONS: tuple[Operation, ...] = tuple(Operation)

#: Call syntaxes allowed for each operation (SPEC section 1).
ALLOWED_SYNTAX: Mapping[Operation, tuple[CallSyntax, ...]] = MappingProxyType(
    {
        Operation.INSERT: (CallSyntax.CALL,),
        Operation.UPDATE: (CallSyntax.CALL, CallSyntax.SCALL, CallSyntax.MCALL, CallSyntax.XCALL),
        Operation.DELETE: (CallSyntax.CALL, CallSyntax.XCALL),
    }
)
DEFAULT_SYNTAX: Mapping[Operation, CallSyntax] = MappingProxyType(
    {Operation.INSERT: CallSyntax.CALL, Operation.UPDATE: CallSyntax.SCALL, Operation.DELETE: CallSyntax.CALL}
)

_SYNTAXES = frozenset(syntax.value for syntax in CallSyntax)
_PROC_RE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_$]*\.)?[A-Za-z_][A-Za-z0-9_$]*$")


@dataclass(frozen=True)
class Propagation:
    operation: Operation
    method: Method
    syntax: CallSyntax | None = None  # set when method is PROC
    procedure: str | None = None  # custom procedure name; None means the generated one

    @property
    def custom(self) -> bool:
        return self.procedure is not None

    @property
    def generated(self) -> bool:
        """Whether it calls a generated procedure (not SQL, NONE or a custom procedure)."""
        return self.method == Method.PROC and self.procedure is None

    @property
    def call_syntax(self) -> CallSyntax:
        """The procedure's call syntax; only a procedure call has one."""
        if self.syntax is None:
            raise ValueError(f"{self.operation} propagates by {self.method}, which calls no procedure")
        return self.syntax

    @property
    def text(self) -> str:
        """The option as written (``SCALL``, ``XCALL audit.upd``, ``SQL``, ``NONE``)."""
        if self.method != Method.PROC:
            return str(self.method).upper()
        syntax = str(self.call_syntax)
        return f"{syntax} {self.procedure}" if self.procedure else syntax


def parse_propagation(operation: Operation | str, value: object, *, article: str = "?") -> Propagation:
    """Parse an ``ins_cmd``/``upd_cmd``/``del_cmd`` value, rejecting syntaxes the operation
    does not allow with the allowed choices in the message."""
    operation = Operation(operation)
    if value is None:
        return Propagation(operation, Method.PROC, DEFAULT_SYNTAX[operation])
    if not isinstance(value, str) or not value.strip():
        raise TopologyError(
            f"{operation.option} of article {article!r} must be a string such as "
            f"{DEFAULT_SYNTAX[operation].value!r}, 'SQL' or 'NONE'"
        )
    words = value.split()
    head = words[0].upper()
    if head in ("SQL", "NONE"):
        if len(words) != 1:
            raise TopologyError(f"{operation.option} {value!r} of article {article!r}: {head} takes no procedure name")
        return Propagation(operation, Method(head.lower()))
    syntax = _call_syntax(operation, head, value, article)
    if len(words) > 2:
        raise TopologyError(f"{operation.option} {value!r} of article {article!r}: expected '<SYNTAX> [procedure]'")
    proc = words[1] if len(words) == 2 else None
    if proc is not None and not _PROC_RE.match(proc):
        raise TopologyError(
            f"{operation.option} of article {article!r}: {proc!r} is not a valid procedure name "
            f"(use name or schema.name)"
        )
    return Propagation(operation, Method.PROC, syntax, proc)


def _call_syntax(operation: Operation, head: str, value: str, article: str) -> CallSyntax:
    """The call syntax ``head`` (upper-cased first word of ``value``), if ``operation`` allows it."""
    option = operation.option
    allowed = ", ".join(ALLOWED_SYNTAX[operation])
    if head == "VCALL":
        raise TopologyError(
            f"{option} {value!r} of article {article!r}: VCALL is reserved for updatable "
            f"subscriptions; choose one of {allowed}, SQL or NONE"
        )
    if head not in _SYNTAXES:
        raise TopologyError(
            f"{option} {value!r} of article {article!r} is not understood; use one of "
            f"{allowed} (optionally followed by a custom procedure name), SQL or NONE"
        )
    syntax = CallSyntax(head)
    if syntax not in ALLOWED_SYNTAX[operation]:
        raise TopologyError(
            f"{option} of article {article!r}: {head} is not allowed for {operation}s; "
            f"allowed call syntaxes: {allowed} (or SQL / NONE)"
        )
    return syntax
