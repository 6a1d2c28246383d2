"""The net change of a batch, whatever engine the subscriber runs: which articles may go by net
change (:func:`article_paths`, :func:`not_net_reason`), a batch's commands collapsed to their
net effect per key (:func:`net_changes`) and split into the rows to delete, update and insert
(:func:`split`).  Pure: no connection.  The rules that keep a net change indistinguishable from
command by command are in :mod:`~airflow_repl.engine.subscriber.bulk_apply` (PostgreSQL's
set-based statements) and :mod:`~airflow_repl.engine.subscriber.mariadb_net_change` (MariaDB's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, count
from operator import itemgetter, ne

from airflow_repl.engine.articles.commands import DELETE, INSERT, UPDATE, Command, OpCode, Values
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.propagation import CallSyntax, Method, Operation

#: Net change holds at most this many commands in memory: a larger batch (one huge transaction,
#: or a batch of big ones) is applied in chunks of this many commands, in order, in the same
#: subscriber transaction.  Each chunk's net effect, applied after the chunks before it, leaves
#: every row as its commands one by one would, so the whole batch does too.
CHUNK_COMMANDS = 100_000

#: A row's primary-key values (text), as the commands carry them.
Key = tuple[str | None, ...]


class NotNetApplicable(Exception):
    """The batch must be applied command by command (a set-based statement found another number
    of rows than the commands expect, or the batch holds what it does not cover)."""


@dataclass(slots=True)
class _Key:
    """The net effect of a batch's commands on one key."""

    existed: bool  # the first command found the row (UPDATE/DELETE): it existed before the batch
    final: Values | None  # the row at the end of the batch (None: deleted)
    deleted: bool = False  # deleted at some point (then, if final, inserted again)
    changed: set[int] = field(default_factory=set)  # columns UPDATEs changed (counted for SCALL/MCALL only)


def eligible(article: ResolvedArticle | None) -> bool:
    """Whether the article's commands may be applied by net change: inserts, updates and deletes
    by generated procedures or SQL statements (their effect is plain DML by key)."""
    return article is not None and not_net_reason(article) is None


def not_net_reason(article: ResolvedArticle) -> str | None:
    """Why the article's commands cannot be applied by net change (None: they can)."""
    if article.include_children:
        return "include_children"
    for op in (Operation.INSERT, Operation.UPDATE, Operation.DELETE):
        prop = article.propagation[op]
        if prop.method == Method.NONE:
            return f"{op.value} propagated as NONE"
        if prop.method == Method.PROC and prop.custom:
            return "custom procedure"
    return None


NET_CHANGE = "net_change"
PER_COMMAND = "per_command"


@dataclass(frozen=True)
class ArticlePath:
    """How a run applies an article's commands (``net_change`` or ``per_command``), and why."""

    article: str
    apply: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"article": self.article, "apply": self.apply, "why": self.why}


def article_paths(
    mode: str,
    articles: Iterable[ResolvedArticle],
    *,
    updatable: str | None = None,
    streams: int = 1,
    triggers: dict[tuple[str, str], list[str]] | None = None,
    scripts: Iterable[str] = (),
) -> list[ArticlePath]:
    """Each article's path under the apply ``mode`` (``auto``, ``per_command``, ``net_change``):
    ``updatable``: the subscription's update mode when it is not read only; ``streams``: its
    ``subscription_streams`` (more than one: batches spread over them, command by command); ``triggers``: the
    subscriber tables' user triggers that fire for replicated changes (``ENABLE ALWAYS`` or
    ``ENABLE REPLICA``), by (schema, table); ``scripts``: the articles with a registered custom
    script.  ``net_change`` takes every article the set-based path covers; ``auto`` only those
    whose result nothing at the subscriber can tell apart from command by command."""
    custom = set(scripts)
    out = []
    for art in articles:
        why = not_net_reason(art)
        if mode == PER_COMMAND:
            why = "apply_mode per_command"
        elif why is None and mode != NET_CHANGE:
            fired = (triggers or {}).get((art.dest_schema, art.dest_table))
            if updatable is not None:
                why = f"updatable subscriber ({updatable})"
            elif streams > 1:
                why = f"subscription_streams {streams} (batches spread over the streams)"
            elif fired:
                why = triggered([art], triggers or {})[art.name].why
            elif art.name in custom:
                why = "custom script registered"
        if why is not None:
            out.append(ArticlePath(art.name, PER_COMMAND, why))
        else:
            reason = (
                "apply_mode net_change"
                if mode == NET_CHANGE
                else "nothing at the subscriber (trigger, custom procedure, updating) can tell it from command by command"
            )
            out.append(ArticlePath(art.name, NET_CHANGE, reason))
    return out


def triggered(arts: Iterable[ResolvedArticle], found: dict[tuple[str, str], list[str]]) -> dict[str, ArticlePath]:
    """The articles whose subscriber tables have a trigger in ``found`` (by (schema, table)),
    each with its command-by-command path saying so: a trigger created after the run chose."""
    out = {}
    for art in arts:
        fired = found.get((art.dest_schema, art.dest_table))
        if fired:
            why = "trigger(s) firing for replicated changes at the subscriber: " + ", ".join(fired)
            out[art.name] = ArticlePath(art.name, PER_COMMAND, why)
    return out


_ROW_OPS = (INSERT, UPDATE, DELETE)


def net_changes(commands: Sequence[Command], articles: dict[str, ResolvedArticle]) -> dict[str, dict[Key, _Key]]:
    """article -> key -> net effect, in the order of the commands (NotNetApplicable when a
    command is outside what the set-based path covers or could not apply in that order).  Runs
    once per command of every batch: the common steps (:func:`_step`'s) are inline."""
    out: dict[str, dict[Key, _Key]] = {}
    #: the eligible articles met so far: their keys, their key's values of an image, and the
    #: columns an UPDATE changed (counted only where they matter: :func:`masked`)
    checked: dict[str, tuple[dict[Key, _Key], Callable[[Values], Key], _Changed]] = {}
    for cmd in commands:
        op, old, new = cmd.op, cmd.old, cmd.new
        entry = checked.get(cmd.article)
        if entry is None or op not in _ROW_OPS:
            entry = _check(cmd, articles, checked, out)
        keys, key_of, changed = entry
        if op == UPDATE:
            assert old is not None and new is not None
            key = key_of(old)
            state = keys.get(key)
            if (moved := key_of(new)) != key:
                # a key change kept as one UPDATE (multi_row_key_changes): the row leaves one key for another
                _step(keys, key, DELETE, old, None)
                _step(keys, moved, INSERT, None, new)
            elif state is None:
                if len(old) != len(new):
                    raise ValueError(f"an UPDATE's images have {len(old)} and {len(new)} columns")
                keys[key] = _Key(True, new, False, changed(old, new))
            elif state.final is not None and len(old) == len(new):
                state.final = new
                state.changed.update(changed(old, new))
            else:
                _step(keys, key, op, old, new, changed)
        elif op == INSERT:
            assert new is not None
            key = key_of(new)
            if key not in keys:
                keys[key] = _Key(False, new)
            else:
                _step(keys, key, op, old, new)
        else:
            assert old is not None
            _step(keys, key_of(old), op, old, new)
    return out


def _check(
    cmd: Command,
    articles: dict[str, ResolvedArticle],
    checked: dict[str, tuple[dict[Key, _Key], Callable[[Values], Key], _Changed]],
    out: dict[str, dict[Key, _Key]],
) -> tuple[dict[Key, _Key], Callable[[Values], Key], _Changed]:
    """A command of an article not met yet, or not a row change: its article's entry of
    :func:`net_changes` (NotNetApplicable when the set-based path does not cover it)."""
    art = articles.get(cmd.article)
    if cmd.op not in _ROW_OPS or art is None or not (cmd.article in checked or eligible(art)):
        raise NotNetApplicable(f"{cmd.op} command of article {cmd.article!r}")
    changed = _changed_columns if masked(art) else _no_columns
    entry = checked[cmd.article] = (out.setdefault(cmd.article, {}), _key_of(art.pk_positions), changed)
    return entry


#: The columns an UPDATE (its before and after images) changed, as :class:`_Key` counts them.
_Changed = Callable[[Values, Values], set[int]]


def _changed_columns(old: Values, new: Values) -> set[int]:
    """The columns whose text differs (:meth:`Command.changed`): SCALL and MCALL set only those."""
    return set(compress(count(), map(ne, old, new)))


def _no_columns(old: Values, new: Values) -> set[int]:
    """None counted: the article's UPDATEs set every column (CALL, XCALL, SQL statements)."""
    return set()


def _key_of(pk: Sequence[int]) -> Callable[[Values], Key]:
    """The primary key's values of an image, as a tuple (C's itemgetter, one per article)."""
    if len(pk) == 1:
        get = itemgetter(pk[0])
        return lambda image: (get(image),)
    if not pk:
        return lambda image: ()
    return itemgetter(*pk)


def _step(
    keys: dict[Key, _Key],
    key: Key,
    op: OpCode,
    old: Values | None,
    new: Values | None,
    changed: _Changed = _changed_columns,
) -> None:
    """One command (``op`` with its before and after images) applied to the net effect on
    ``key`` (``changed``: the columns an UPDATE changed, as its article counts them)."""
    state = keys.get(key)
    if op == INSERT:
        if state is None:
            keys[key] = _Key(existed=False, final=new)
        elif state.final is None:
            state.final = new
        else:
            raise NotNetApplicable("an INSERT of a row the batch already has")
        return
    if state is not None and state.final is None:
        raise NotNetApplicable(f"an {op} of a row the batch deleted")
    if op == UPDATE:
        assert old is not None and new is not None
        if state is None:
            state = keys[key] = _Key(existed=True, final=new)
        state.final = new
        if len(old) != len(new):
            raise ValueError(f"an UPDATE's images have {len(old)} and {len(new)} columns")
        state.changed.update(changed(old, new))
        return
    if state is None:
        keys[key] = _Key(existed=True, final=None, deleted=True)
    elif not state.existed and not state.deleted:
        del keys[key]  # inserted and deleted within the batch: no net change
    else:
        state.final, state.deleted = None, True


@dataclass
class Split:
    """An article's net change as rows: the keys to delete (first), the final images of the
    rows that existed before the batch to update, by the columns they set (every column, or for
    SCALL and MCALL the columns some UPDATE of the batch changed), and the rows to insert."""

    deletes: list[Key]
    updates: dict[tuple[int, ...], list[Values]]
    inserts: list[Values]


def masked(art: ResolvedArticle) -> bool:
    """UPDATEs set only the columns the batch changed (SCALL and MCALL), as each command's bitmap would."""
    update = art.propagation[Operation.UPDATE]
    return update.method == Method.PROC and update.call_syntax in (CallSyntax.SCALL, CallSyntax.MCALL)


def split(art: ResolvedArticle, keys: dict[Key, _Key]) -> Split:
    """The article's net effect per key (:func:`net_changes`) as the rows its DELETE, UPDATEs and
    INSERT carry: a row deleted (or deleted and inserted again) is deleted, before any insert."""
    by_mask = masked(art)
    every = tuple(range(len(art.column_names)))
    out = Split([], {}, [])
    for key, state in keys.items():
        final = state.final
        if state.existed and (state.deleted or final is None):
            out.deletes.append(key)
        if final is None:
            continue
        if not state.existed or state.deleted:
            out.inserts.append(final)
        else:
            out.updates.setdefault(tuple(sorted(state.changed)) if by_mask else every, []).append(final)
    return out
