"""The rule that makes an immediate subscriber converge, without a server: a publisher command of
a key the subscriber's own change took later (commit order) is left out of the batch; one newer
than it is applied; a key update superseded at one of its keys keeps its other side."""

from __future__ import annotations

import pytest
from article_builder import text_article

from airflow_repl.engine.articles.commands import DELETE, INSERT, TRUNCATE, UPDATE, Command
from airflow_repl.engine.model.updating import ConflictPolicy
from airflow_repl.engine.postgres.lsn import lsn_to_int
from airflow_repl.engine.subscriber import statements
from airflow_repl.engine.subscriber.superseded import Superseding, Taken

ART = text_article()
ARTICLES = {"t": ART}


def superseding(keys: dict[str, int | None]) -> Superseding:
    """Keys of article ``t`` taken by a transaction at the given position (None: not stored yet)."""
    sup = Superseding(None, "p", "origin", ConflictPolicy.PUB_WINS)  # type: ignore[arg-type]  # no server asked
    sup.articles = ARTICLES
    sup.keys = {"t": {(k,): (at, {"id": int(k)}) for k, at in keys.items()}}
    return sup


def at(lsn: str) -> int:
    return lsn_to_int(lsn)


def filtered(sup: Superseding, *located):
    return [(x, c, cmd.op, cmd.old, cmd.new) for x, c, cmd in sup.filter(located, ARTICLES)]


def test_commands_older_than_the_subscribers_change_are_left_out_and_newer_ones_applied():
    sup = superseding({"50": at("0/500"), "51": None})
    older_insert = ("0/100", 1, Command(INSERT, "t", new=["50", "a", "b"]))
    older_delete = ("0/200", 1, Command(DELETE, "t", old=["50", "a", "b"]))
    newer_update = ("0/600", 1, Command(UPDATE, "t", old=["50", "s", "b"], new=["50", "n", "b"]))
    not_stored_yet = ("0/900", 2, Command(INSERT, "t", new=["51", "a", "b"]))  # its change is later than all
    other_key = ("0/100", 2, Command(INSERT, "t", new=["52", "a", "b"]))
    out = filtered(sup, older_insert, older_delete, newer_update, not_stored_yet, other_key)
    assert out == [
        ("0/600", 1, UPDATE, ["50", "s", "b"], ["50", "n", "b"]),
        ("0/100", 2, INSERT, None, ["52", "a", "b"]),
    ]
    assert [(left.xact, left.command_id, left.key) for left in sup.left] == [
        ("0/100", 1, {"id": 50}),
        ("0/200", 1, {"id": 50}),
        ("0/900", 2, {"id": 51}),
    ]


def test_a_key_update_superseded_at_one_key_keeps_its_other_side():
    sup = superseding({"60": None, "70": None})
    leaves = ("0/100", 1, Command(UPDATE, "t", old=["3", "a", "b"], new=["60", "a", "b"]))
    arrives = ("0/100", 2, Command(UPDATE, "t", old=["70", "a", "b"], new=["71", "a", "b"]))
    both = ("0/100", 3, Command(UPDATE, "t", old=["60", "a", "b"], new=["70", "a", "b"]))
    assert filtered(sup, leaves, arrives, both) == [
        ("0/100", 1, DELETE, ["3", "a", "b"], None),  # the row leaves 3; 60 is the subscriber's
        ("0/100", 2, INSERT, None, ["71", "a", "b"]),  # the row arrives at 71; 70 is the subscriber's
    ]
    assert [left.command_id for left in sup.left] == [1, 2, 3]


def test_a_truncate_keeps_the_remembered_rows_and_other_articles_pass_untouched():
    sup = superseding({"50": None})
    other = ("0/100", 1, Command(INSERT, "u", new=["50"]))
    truncate = ("0/100", 2, Command(TRUNCATE, "t"))
    out = list(sup.filter([other, truncate], ARTICLES))
    assert out[0] == other and (out[1][1], out[1][2].op, out[1][2].keep_own) == (2, TRUNCATE, True)
    assert list(superseding({}).filter([other, truncate], ARTICLES)) == [other, truncate]


def test_a_truncate_that_keeps_rows_deletes_all_but_the_subscribers_own():
    immediate = statements.truncate_keeping_own(ART, queued=False)
    text = immediate.query.as_string(None)
    assert text.startswith('DELETE FROM "public"."t" AS t WHERE NOT EXISTS (SELECT 1 FROM airflow_repl.queue_taken k')
    assert "k.key = pg_catalog.jsonb_build_object('id', t.\"id\")" in text and "airflow_repl.queue q" not in text
    queued = statements.truncate_keeping_own(ART, queued=True).query.as_string(None)
    assert "(q.old @> pg_catalog.jsonb_build_object('id', t.\"id\")" in queued
    assert immediate.params_of(Command(TRUNCATE, "t")) == ["p", "t"]


@pytest.mark.parametrize(
    ("command", "xact", "expected"),
    [
        ({"n": ["50", "a", "b"]}, "0/100", True),
        ({"o": ["50", "a", "b"]}, "0/100", True),
        ({"o": ["50", "a", "b"]}, "0/600", False),  # newer than the subscriber's change
        ({"o": ["9", "a", "b"], "n": ["50", "a", "b"]}, "0/100", True),
        ({"n": ["52", "a", "b"]}, "0/100", False),
        (None, "0/100", False),
    ],
)
def test_a_failed_commands_key_is_asked_again(command, xact, expected):
    assert superseding({"50": at("0/500")}).covers(ART, command, xact) is expected


def test_a_transaction_not_stored_yet_is_later_than_any_command():
    taken = Taken({1: at("0/500"), 2: None})
    assert taken.later(1, at("0/400")) and not taken.later(1, at("0/500"))
    assert taken.later(2, at("FF/0")) and taken.later(3, at("0/1"))  # 3: remembered since it was loaded
