"""Replication commands: what the Log Reader Agent stores for each published row change.

A command carries article-ordered text values (PostgreSQL's text representation, exactly what
pgoutput sends), so that applying it at a subscriber reproduces the publisher's values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.propagation import Operation, TextEnum


class OpCode(TextEnum):
    """A command's operation, as stored in ``airflow_repl.commands.op`` (one letter)."""

    INSERT = "I"
    UPDATE = "U"
    DELETE = "D"
    TRUNCATE = "T"
    SCHEMA = "S"  # a schema change of the article's table (airflow-repl schema-change)

    @property
    def operation(self) -> Operation:
        """The article operation whose propagation option applies this command (TRUNCATE and
        schema changes have none)."""
        if self not in _OPERATION:
            raise ValueError(f"a {self.name} command is not applied through an article option")
        return _OPERATION[self]


_OPERATION = {OpCode.INSERT: Operation.INSERT, OpCode.UPDATE: Operation.UPDATE, OpCode.DELETE: Operation.DELETE}

INSERT, UPDATE, DELETE, TRUNCATE = OpCode.INSERT, OpCode.UPDATE, OpCode.DELETE, OpCode.TRUNCATE
SCHEMA = OpCode.SCHEMA

Value = str | None  # a column value in PostgreSQL's text representation; None is NULL
Values = list[Value]  # article column order


@dataclass(slots=True)
class Command:
    op: OpCode
    article: str
    old: Values | None = None  # before image (U, D)
    new: Values | None = None  # after image (I, U)
    pair: bool = False  # half of the DELETE + INSERT pair an UPDATE became
    #: a schema change (SCHEMA): what changed ("change") and the article's definitions
    #: "before" and "after" it (ResolvedArticle.to_dict())
    schema: dict[str, Any] | None = None
    #: a TRUNCATE applied at an updatable subscriber as a delete of every row but those its own
    #: later changes hold (:mod:`~airflow_repl.engine.subscriber.superseded`); never stored
    keep_own: bool = False

    def changed(self) -> list[bool]:
        """Which article columns an UPDATE changed (compared by text value)."""
        assert self.old is not None and self.new is not None
        return [o != n for o, n in zip(self.old, self.new, strict=True)]

    def key(self, article: ResolvedArticle, image: str | None = None) -> Values:
        values = self.old if (image == "old" or (image is None and self.op != INSERT)) else self.new
        assert values is not None
        return [values[i] for i in article.pk_positions]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.old is not None:
            data["o"] = self.old
        if self.new is not None:
            data["n"] = self.new
        if self.pair:
            data["p"] = 1
        if self.schema is not None:
            data["s"] = self.schema
        return data

    @classmethod
    def from_json(cls, op: str, article: str, data: dict[str, Any]) -> Command:
        code = _OPCODES.get(op) or OpCode(op)  # a dictionary look-up per stored command, not Enum's call
        return cls(code, article, data.get("o"), data.get("n"), bool(data.get("p")), data.get("s"))


_OPCODES: dict[str, OpCode] = {code.value: code for code in OpCode}


def bitmask(changed: Sequence[bool]) -> bytes:
    """SQL Server's changed-columns bitmap: column k (1-based) is bit 2^((k-1) % 8) of byte
    ((k-1) // 8) + 1."""
    out = bytearray((len(changed) + 7) // 8)
    for k, flag in enumerate(changed):
        if flag:
            out[k // 8] |= 1 << (k % 8)
    return bytes(out)


def key_changed(article: ResolvedArticle, old: Values, new: Values) -> bool:
    """True when an UPDATE changes a primary-key column or a column of a unique constraint."""
    return any(old[i] != new[i] for i in article.key_positions)


def update_commands(article: ResolvedArticle, old: Values, new: Values) -> list[Command]:
    """One UPDATE at the publisher becomes an UPDATE command, or a DELETE + INSERT pair when it
    changes a key (SQL Server's deferred update, KB 238254) or when the article delivers every
    update as a pair."""
    if article.update_mode == "all" or key_changed(article, old, new):
        return [Command(DELETE, article.name, old=old, pair=True), Command(INSERT, article.name, new=new, pair=True)]
    return [Command(UPDATE, article.name, old=old, new=new)]
