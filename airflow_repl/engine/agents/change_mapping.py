"""From pgoutput row changes to replication commands: which article a decoded relation belongs
to (an article that includes its inheritance children is found under each child's name too),
which of its columns the article keeps, and the commands one row change or TRUNCATE becomes.

Owns the checks that refuse changes which cannot be replicated exactly: a table without
REPLICA IDENTITY FULL, a table whose columns changed outside ``airflow-repl schema-change``
(a published column gone or retyped, a column added to an article without a column filter), a
TRUNCATE of only part of an inheritance hierarchy whose article includes the children.  No SQL, no server: the Log
Reader Agent feeds it decoded messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_repl.engine.agents import command_lines
from airflow_repl.engine.articles.commands import DELETE, INSERT, TRUNCATE, Command, update_commands
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.postgres import pgoutput

RowChange = pgoutput.Insert | pgoutput.Update | pgoutput.Delete


@dataclass
class RelationMap:
    """How the changes of one decoded relation become commands of its article."""

    article: ResolvedArticle
    positions: list[int]  # relation column index for each article column
    child: bool = False  # an inheritance child of the article's table (include_children)
    #: the article has every column of the relation, in its order: a decoded image is the article's as it is
    identity: bool = field(init=False)
    #: positions, and the article's key positions, as the compiled command lines take them
    positions_u16: bytes = field(init=False)
    keys_u16: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.identity = self.positions == list(range(len(self.positions)))
        self.positions_u16 = command_lines.uint16s(self.positions)
        self.keys_u16 = command_lines.uint16s(self.article.key_positions)


def relation_articles(articles: list[ResolvedArticle]) -> dict[tuple[str, str], ResolvedArticle]:
    """(schema, table) of every published relation -> its article.  pgoutput names a change by
    the table it happened in, so an article that includes its inheritance children (the child
    set resolved when the topology was applied) is found under each child's name as well."""
    out = {(a.table.schema, a.table.name): a for a in articles}
    for art in articles:
        for schema, table in art.children or []:
            out[(schema, table)] = art
    return out


def map_relation(rel: pgoutput.Relation, articles: dict[tuple[str, str], ResolvedArticle]) -> RelationMap | None:
    """The map of a relation message (None: the relation is not published here)."""
    art = articles.get((rel.namespace, rel.name))
    if art is None:
        return None
    is_child = (rel.namespace, rel.name) != (art.table.schema, art.table.name)
    if rel.replica_identity != "f":
        raise ReplError(
            f"table {rel.namespace}.{rel.name} (article {art.name!r}) was changed without REPLICA IDENTITY FULL, so "
            f"these changes carry incomplete before images and cannot be replicated exactly: restore it with "
            f"'airflow-repl apply', then drop the publication's slot and run the Snapshot Agent with reinitialize"
        )
    _check_columns(rel, art, is_child)
    # a child's columns are the parent's (by name, in any order) plus its own, which are dropped
    return RelationMap(art, [rel.columns.index(c) for c in art.column_names], is_child)


def _check_columns(rel: pgoutput.Relation, art: ResolvedArticle, is_child: bool) -> None:
    """The relation still has the article's columns with their types, and (an article without
    a column filter) no others: a schema change made at the publisher outside
    ``airflow-repl schema-change`` stops the Log Reader here, before its changes are stored."""
    missing = [c for c in art.column_names if c not in rel.columns]
    added = [] if art.column_list is not None or is_child else [c for c in rel.columns if c not in art.column_names]
    retyped = [
        c.name
        for c in art.columns
        if c.name in rel.columns and c.type_oid and rel.type_oids[rel.columns.index(c.name)] != c.type_oid
    ]
    if not (missing or added or retyped):
        return
    what = "; ".join(
        f"{label} {names}"
        for label, names in (("no column(s)", missing), ("new column(s)", added), ("another type for", retyped))
        if names
    )
    raise ReplError(
        f"table {rel.namespace}.{rel.name} (article {art.name!r}) was changed at the publisher outside airflow-repl "
        f"({what}); the Log Reader stopped before storing changes it cannot map. Make schema changes with "
        f"'airflow-repl schema-change'; to recover, undo the change at the publisher if no rows changed since, "
        f"otherwise drop the publication's slot and run the Snapshot Agent with reinitialize"
    )


def truncated_articles(relmaps: list[RelationMap | None]) -> list[str]:
    """The articles one TRUNCATE empties.  An article that includes its inheritance children is
    emptied only when its table and every child were truncated together (TRUNCATE without
    ONLY); any other part cannot be replicated: the subscriber table holds all their rows."""
    hits: dict[str, list[RelationMap]] = {}
    for m in relmaps:
        if m is not None:
            hits.setdefault(m.article.name, []).append(m)
    for name, maps in hits.items():
        art = maps[0].article
        children = sum(m.child for m in maps)
        if art.include_children and (len(maps) - children != 1 or children != len(art.children or [])):
            raise ReplError(
                f"a TRUNCATE of only part of {art.table.qualified} and its inheritance children cannot be "
                f"replicated to article {name!r}, which includes its children (the subscriber table holds "
                f"their rows together): drop the publication's slot and run the Snapshot Agent with reinitialize "
                f"for every subscription; delete rows instead of truncating part of the hierarchy"
            )
    return sorted(hits)


def truncate_command(article: str) -> Command:
    return Command(TRUNCATE, article)


def row_commands(change: RowChange, relmap: RelationMap) -> list[Command]:
    """The commands one row change becomes (an UPDATE may become a DELETE + INSERT pair).
    Unchanged TOASTed values of an UPDATE's after image are taken from its before image."""
    art = relmap.article
    if isinstance(change, pgoutput.Insert):
        return [Command(INSERT, art.name, new=_image(change.new, relmap))]
    if isinstance(change, pgoutput.Delete):
        return [Command(DELETE, art.name, old=_image(change.old, relmap))]
    if change.old is None:
        raise ReplError(
            f"table {art.table.qualified} lost REPLICA IDENTITY FULL, so its updates carry no before "
            f"image; re-apply the topology (airflow-repl apply) to restore it"
        )
    old = _image(change.old, relmap)
    new = _image(change.new, relmap)
    unchanged = pgoutput.UNCHANGED_TOAST
    merged = [o if n is unchanged else n for o, n in zip(old, new, strict=True)]
    return update_commands(art, old, merged)


def _image(values: list[Any], relmap: RelationMap) -> list[Any]:
    """The article's columns of a decoded image: the image itself (a list of its own, which the
    decoder made for this change) when the article has every column of the relation in order."""
    if relmap.identity and len(values) == len(relmap.positions):
        return values
    return [values[p] for p in relmap.positions]
