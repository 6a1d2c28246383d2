"""What the Log Reader makes of decoded changes, without a server: unchanged TOASTed values taken
from the before image, inherited tables mapped to their article (and partial truncates refused),
and key updates stored as delete/insert pairs that apply one by one without duplicates."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest

from airflow_repl.engine.agents import change_mapping, log_reader_agent
from airflow_repl.engine.articles.commands import DELETE, INSERT, Command
from airflow_repl.engine.articles.resolved import ResolvedArticle, resolve_articles
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model.topology import from_dict
from airflow_repl.engine.postgres import pgoutput
from airflow_repl.engine.postgres.catalog import Column, TableInfo


# ---------------------------------------------------------------------- unchanged TOAST
def test_unchanged_toast_takes_the_before_image():
    table = TableInfo(
        "s",
        "t",
        1,
        [Column("id", "integer", True, 23), Column("big", "text", False, 25), Column("n", "integer", False, 23)],
        ["id"],
    )
    topo = from_dict(
        {
            "publisher": "a",
            "distributor": "b",
            "publications": [{"name": "p", "articles": [{"table": "s.t", "upd_cmd": "SCALL"}]}],
        }
    )
    art = resolve_articles(topo.publication("p"), {"t": table})[0]
    relmap = change_mapping.RelationMap(art, [1, 2, 0])  # the relation lists n, id, big
    (cmd,) = change_mapping.row_commands(
        pgoutput.Update(1, ["5", "1", "x" * 10], ["6", "1", pgoutput.UNCHANGED_TOAST]), relmap
    )
    assert (cmd.op, cmd.old, cmd.new, cmd.changed()) == (
        "U",
        ["1", "x" * 10, "5"],
        ["1", "x" * 10, "6"],
        [False, False, True],
    )


# ---------------------------------------------------------------------- inheritance
def _article(name: str, include_children: bool, children: list[list[str]] | None = None):
    from airflow_repl.engine.articles.resolved import resolve_articles
    from airflow_repl.engine.model import topology as topology_mod
    from airflow_repl.engine.postgres.catalog import Column, TableInfo

    pub = topology_mod.Publication(
        name="p", articles=[topology_mod.Article(table=name, include_children=include_children)]
    )
    table = TableInfo("public", name, 1, [Column("id", "integer", True, 23), Column("v", "text", False, 25)], ["id"])
    art = resolve_articles(pub, {name: table})[0]
    art.children = children
    return art


def test_children_map_to_their_article_and_partial_truncates_are_refused():
    only, fam = _article("only_t", False), _article("fam", True, [["public", "fam_1"], ["s", "fam_2"]])
    rel = change_mapping.relation_articles([only, fam])
    assert rel == {("public", "only_t"): only, ("public", "fam"): fam, ("public", "fam_1"): fam, ("s", "fam_2"): fam}
    assert fam.source.as_string(None) == '"public"."fam"' and only.source.as_string(None) == 'ONLY "public"."only_t"'
    own, c1, c2 = (change_mapping.RelationMap(fam, [0, 1], child) for child in (False, True, True))
    assert change_mapping.truncated_articles([own, c1, c2, change_mapping.RelationMap(only, [0, 1]), None]) == [
        "fam",
        "only_t",
    ]
    for part in ([own], [c1], [c1, c2], [own, c2]):
        with pytest.raises(ReplError, match=r"TRUNCATE of only part of public.fam"):
            change_mapping.truncated_articles(part)
    # the definition (and so the subscription fingerprint) carries the children only when included
    assert "children" not in only.to_dict() and fam.to_dict()["children"] == [["public", "fam_1"], ["s", "fam_2"]]
    from airflow_repl.engine.articles.resolved import ResolvedArticle

    assert ResolvedArticle.from_dict(fam.to_dict()).children == fam.children


# ---------------------------------------------------------------------- partitioned tables
def _partitioned(**options):
    pub = from_dict(
        {
            "publisher": "a",
            "distributor": "b",
            "publications": [{"name": "p", "articles": [{"table": "public.ev", **options}]}],
        }
    ).publication("p")
    columns = [Column("d", "date", True, 1082), Column("id", "integer", True, 23), Column("v", "text", False, 25)]
    return resolve_articles(pub, {"ev": TableInfo("public", "ev", 1, columns, ["d", "id"], partitioned=True)})[0]


def _relation(name: str, identity: str) -> pgoutput.Relation:
    return pgoutput.Relation(1, "public", name, identity, ["d", "id", "v"], [1082, 23, 25])


def test_partitions_announced_without_full_identity_refuse_what_their_images_cannot_carry():
    art = _partitioned()
    articles = change_mapping.relation_articles([art])
    partitions = change_mapping.Partitions()
    for rel in (_relation("ev", "f"), _relation("ev_1", "f"), _relation("ev", "f"), _relation("ev_2", "d")):
        partitions.relation(rel, articles)
    relmap = change_mapping.map_relation(_relation("ev", "f"), articles, partitions)
    assert relmap is not None and relmap.incomplete == (("public.ev_2", "d"),)
    old, new = ["2024-01-01", "1", None], ["2024-01-01", "1", "x"]
    # what a default identity logs is enough: deletes by key, key updates as pairs, updates of a
    # full partition (a before image with an unchanged key comes from one)
    assert [c.op for c in change_mapping.row_commands(pgoutput.Delete(1, old), relmap)] == ["D"]
    moved = pgoutput.Update(1, old, ["2024-01-01", "2", "x"])
    assert [c.op for c in change_mapping.row_commands(moved, relmap)] == ["D", "I"]
    assert [c.op for c in change_mapping.row_commands(pgoutput.Update(1, old, new), relmap)] == ["U"]
    with pytest.raises(ReplError, match=r"the update of a row of partitioned table public.ev .* public.ev_2 "):
        change_mapping.row_commands(pgoutput.Update(1, None, new), relmap)
    for options, change in (({"del_cmd": "XCALL"}, pgoutput.Delete(1, old)), ({}, moved)):
        other = _partitioned(**options)
        if not options:
            other.update_mode = "multi_row_key_changes"  # a single-row key update stays one UPDATE
        other_map = change_mapping.RelationMap(other, [0, 1, 2], incomplete=(("public.ev_2", "d"),))
        with pytest.raises(ReplError, match="may come from partition"):
            change_mapping.row_commands(change, other_map)
    # the partition announced again with REPLICA IDENTITY FULL: nothing is incomplete any more
    partitions.relation(_relation("ev", "f"), articles)
    partitions.relation(_relation("ev_2", "f"), articles)
    assert partitions.of(art) == ()
    # an article's own relation that follows another relation is not taken for a partition
    partitions.relation(_relation("ev", "f"), articles)
    partitions.relation(_relation("ev", "f"), articles)
    assert partitions.of(art) == ()
    assert ResolvedArticle.from_dict(art.to_dict()).table.partitioned
    assert "partitioned" not in _article("plain", False).table.to_dict()


# ---------------------------------------------------------------------- key shifts
def _run(pairs: list[tuple[list, list]], chunk: int = 1000) -> list[tuple[str, list]]:
    """What the Log Reader stores for a sequence of key updates (old, new) of one article."""
    writer = log_reader_agent._TxnWriter(None, "p", chunk)  # no staging below `chunk` pairs: no server
    writer.begin("0/1")
    for old, new in pairs:
        writer.row_change("a", [Command(DELETE, "a", old=old, pair=True), Command(INSERT, "a", new=new, pair=True)])
    writer.close_run()
    return [(row[4], json_image(row[5])) for row in map(copy_fields, writer.buffer)]


def copy_fields(line: bytes) -> list[str | None]:
    """The fields of one line of COPY's text format (what the server reads from it)."""
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    escapes = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t"}
    return [
        None if f == b"\\N" else re.sub(r"\\(.)", lambda m: escapes[m[1]], f.decode()) for f in line[:-1].split(b"\t")
    ]


def json_image(data: str) -> list:
    d = json.loads(data)
    return d.get("o") or d.get("n")


def apply_one_by_one(table: set[tuple], commands: list[tuple[str, list]]) -> set[tuple]:
    """Apply commands one at a time with an immediately checked unique key (column 0)."""
    rows_ = {r[0]: tuple(r) for r in table}
    for op, image in commands:
        if op == "D":
            assert rows_.pop(image[0]) == tuple(image)
        else:
            assert image[0] not in rows_, f"duplicate key {image[0]}"
            rows_[image[0]] = tuple(image)
    return set(rows_.values())


SHIFTS = {  # name: (rows before, the row changes one statement or transaction makes, in scan order)
    "shift_up_equal_rows": (
        {("1", "x"), ("2", "x"), ("3", "x")},
        [(["1", "x"], ["2", "x"]), (["2", "x"], ["3", "x"]), (["3", "x"], ["4", "x"])],
    ),
    "shift_down_equal_rows": (
        {("1", "x"), ("2", "x"), ("3", "x")},
        [(["3", "x"], ["2", "x"]), (["2", "x"], ["1", "x"]), (["1", "x"], ["0", "x"])],
    ),
    "swap_equal_rows": ({("1", "x"), ("2", "x")}, [(["1", "x"], ["2", "x"]), (["2", "x"], ["1", "x"])]),
    "swap_different_rows": ({("1", "a"), ("2", "b")}, [(["1", "a"], ["2", "a"]), (["2", "b"], ["1", "b"])]),
    "later_statement_moves_the_produced_row": (
        {("1", "x"), ("5", "y")},
        [(["1", "x"], ["2", "x"]), (["2", "x"], ["3", "x"]), (["5", "y"], ["1", "y"])],
    ),
    "chain_through_a_freed_key": (
        {("1", "x"), ("2", "y")},
        [(["2", "y"], ["9", "y"]), (["1", "x"], ["2", "x"]), (["2", "x"], ["2", "z"])],
    ),
}


@pytest.mark.parametrize("name", SHIFTS)
def test_key_update_runs_apply_one_by_one_without_duplicates(name):
    before, pairs = SHIFTS[name]
    expected = list(before)
    for old, new in pairs:  # the publisher's effect: a multiset, keys checked only at the end
        expected.remove(tuple(old))
        expected.append(tuple(new))
    commands = _run(pairs)
    assert apply_one_by_one(before, commands) == set(expected)
    deletes = [image for op, image in commands if op == "D"]
    assert deletes == [d for d in deletes if tuple(d) in before]  # only rows that existed before the run


# ---------------------------------------------------------------------- writing
def test_transaction_rows_are_written_with_their_commands_every_chunk(monkeypatch):
    """Command lines go out on one open COPY, chunk by chunk; it ends before the transactions'
    rows are written (every ``chunk`` transactions, and at the end of the batch)."""
    written: list[tuple[str, int]] = []

    class Copy:
        def __init__(self, _conn):
            written.append(("open", 0))

        def write(self, lines: bytes) -> None:
            written.append(("C", lines.count(b"\n")))

        def end(self) -> None:
            written.append(("end", 0))

    monkeypatch.setattr(log_reader_agent.dist_transactions, "CommandCopy", Copy)
    monkeypatch.setattr(
        log_reader_agent.dist_transactions, "copy_transactions", lambda _c, rows: written.append(("T", len(rows)))
    )
    writer = log_reader_agent._TxnWriter(None, "p", 3)
    for n in range(7):
        writer.begin(f"0/{n + 1}")
        writer.row_change("a", [Command(INSERT, "a", new=[str(n)])])
        writer.end(datetime.now(timezone.utc), n + 2)
    # bounded: never more than chunk lines or rows at a time
    assert written == [("open", 0), ("C", 3), ("end", 0), ("T", 3), ("open", 0), ("C", 3), ("end", 0), ("T", 3)]
    writer.flush_batch()
    assert written[8:] == [("open", 0), ("C", 1), ("end", 0), ("T", 1)]
