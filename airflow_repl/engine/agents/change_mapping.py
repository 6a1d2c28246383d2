"""From pgoutput row changes to replication commands: which article a decoded relation belongs
to (an article that includes its inheritance children is found under each child's name too),
which of its columns the article keeps, and the commands one row change or TRUNCATE becomes.

Owns the checks that refuse changes which cannot be replicated exactly: a table without
REPLICA IDENTITY FULL (or, for a partitioned table, a partition without it: :class:`Partitions`),
a table whose columns changed outside ``airflow-repl schema-change``
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
from airflow_repl.engine.model.propagation import CallSyntax, Operation
from airflow_repl.engine.postgres import pgoutput
from airflow_repl.engine.postgres.copy_escaping import copy_field

RowChange = pgoutput.Insert | pgoutput.Update | pgoutput.Delete


@dataclass
class RelationMap:
    """How the changes of one decoded relation become commands of its article."""

    article: ResolvedArticle
    positions: list[int]  # relation column index for each article column
    child: bool = False  # an inheritance child of the article's table (include_children)
    #: (partition, replica identity) of the article's partitions announced without REPLICA
    #: IDENTITY FULL (:class:`Partitions`): a before image of this relation may be incomplete
    incomplete: tuple[tuple[str, str], ...] = ()
    #: the article has every column of the relation, in its order: a decoded image is the article's as it is
    identity: bool = field(init=False)
    #: positions, and the article's key positions, as the compiled command lines take them
    positions_u16: bytes = field(init=False)
    keys_u16: bytes = field(init=False)
    #: the article's name as a COPY field, and whether its every UPDATE is a pair (update_mode all)
    name_field: bytes = field(init=False)
    pairs: bool = field(init=False)

    def __post_init__(self) -> None:
        self.identity = self.positions == list(range(len(self.positions)))
        self.positions_u16 = command_lines.uint16s(self.positions)
        self.keys_u16 = command_lines.uint16s(self.article.key_positions)
        self.name_field = copy_field(self.article.name)
        self.pairs = self.article.update_mode == "all"


def relation_articles(articles: list[ResolvedArticle]) -> dict[tuple[str, str], ResolvedArticle]:
    """(schema, table) of every published relation -> its article.  pgoutput names a change by
    the table it happened in, so an article that includes its inheritance children (the child
    set resolved when the topology was applied) is found under each child's name as well."""
    out = {(a.table.schema, a.table.name): a for a in articles}
    for art in articles:
        for schema, table in art.children or []:
            out[(schema, table)] = art
    return out


class Partitions:
    """The replica identity of the partitions of partitioned articles, as the stream announces
    them.  pgoutput publishes a partition's changes as its partitioned table's
    (``publish_via_partition_root``): before a partition's first change (and again after its
    definition changed) it sends the table's Relation message, then the partition's own, which
    carries the partition's replica identity.  A partition without REPLICA IDENTITY FULL (one
    created or attached since the topology was applied, with the default identity) logs only
    the key of a before image, or none when the key stays, and its changes cannot be told from
    the other partitions' once announced: the table's relation map lists such partitions
    (:attr:`RelationMap.incomplete`), and :func:`row_commands` refuses the changes whose
    commands would need what may be missing."""

    def __init__(self) -> None:
        self.incomplete: dict[str, dict[str, str]] = {}  # article -> partition -> replica identity
        self._table: ResolvedArticle | None = None  # the partitioned article just announced

    def relation(self, rel: pgoutput.Relation, articles: dict[tuple[str, str], ResolvedArticle]) -> None:
        """Note a Relation message: a partitioned article's table, or the partition after it."""
        art = articles.get((rel.namespace, rel.name))
        if art is None and self._table is not None:
            partitions = self.incomplete.setdefault(self._table.name, {})
            if rel.replica_identity == "f":
                partitions.pop(f"{rel.namespace}.{rel.name}", None)
            else:
                partitions[f"{rel.namespace}.{rel.name}"] = rel.replica_identity
        self._table = art if art is not None and art.table.partitioned else None

    def of(self, art: ResolvedArticle) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.incomplete.get(art.name, {}).items()))


def map_relation(
    rel: pgoutput.Relation,
    articles: dict[tuple[str, str], ResolvedArticle],
    partitions: Partitions | None = None,
) -> RelationMap | None:
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
    incomplete = partitions.of(art) if partitions is not None and art.table.partitioned else ()
    return RelationMap(art, [rel.columns.index(c) for c in art.column_names], is_child, incomplete)


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
        _check_before_image(relmap, "delete", key_only=True)
        return [Command(DELETE, art.name, old=_image(change.old, relmap))]
    if change.old is None:
        if relmap.incomplete:
            _check_before_image(relmap, "update", key_only=False)
        raise ReplError(
            f"table {art.table.qualified} lost REPLICA IDENTITY FULL, so its updates carry no before "
            f"image; re-apply the topology (airflow-repl apply) to restore it"
        )
    old = _image(change.old, relmap)
    new = _image(change.new, relmap)
    if relmap.incomplete and [old[i] for i in art.pk_positions] != [new[i] for i in art.pk_positions]:
        # a partition with the default identity sends a before image only when the key changes
        _check_before_image(relmap, "key update", key_only=art.update_mode != "multi_row_key_changes")
    unchanged = pgoutput.UNCHANGED_TOAST
    merged = [o if n is unchanged else n for o, n in zip(old, new, strict=True)]
    return update_commands(art, old, merged)


def _check_before_image(relmap: RelationMap, change: str, *, key_only: bool) -> None:
    """A change of a partitioned article whose before image may come from a partition without
    REPLICA IDENTITY FULL: the default identity (its primary key) logs the key, which is all a
    delete or a key update delivered as a DELETE + INSERT pair uses (``key_only``), unless the
    delete passes the whole before image (XCALL); anything else cannot be replicated exactly."""
    art = relmap.article
    if not relmap.incomplete:
        return
    default_identity = all(identity == "d" for _, identity in relmap.incomplete)
    if key_only and default_identity and art.propagation[Operation.DELETE].syntax != CallSyntax.XCALL:
        return
    partitions = ", ".join(f"{name} (REPLICA IDENTITY {_IDENTITIES.get(i, i)})" for name, i in relmap.incomplete)
    raise ReplError(
        f"the {change} of a row of partitioned table {art.table.qualified} (article {art.name!r}) may come from "
        f"partition(s) "
        f"{partitions}, which logged it without its whole before image, so it cannot be replicated exactly; the "
        f"Log Reader stopped before storing it. Partitions created or attached later get REPLICA IDENTITY FULL "
        f"from 'airflow-repl apply' and from every Log Reader run, before their rows may be updated or deleted; to "
        f"recover, drop the publication's slot and run the Snapshot Agent with reinitialize"
    )


_IDENTITIES = {"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX"}


def _image(values: list[Any], relmap: RelationMap) -> list[Any]:
    """The article's columns of a decoded image: the image itself (a list of its own, which the
    decoder made for this change) when the article has every column of the relation in order."""
    if relmap.identity and len(values) == len(relmap.positions):
        return values
    return [values[p] for p in relmap.positions]
