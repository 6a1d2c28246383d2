"""A batch's net change as MariaDB statements (mariadb_net_change), without a server: what each
statement carries, how names and values are quoted, and which articles may go that way."""

from __future__ import annotations

from article_builder import text_article

from airflow_repl.engine.articles.commands import DELETE, INSERT, UPDATE, Command
from airflow_repl.engine.subscriber import mariadb_net_change, net_change

HOSTILE = "t`; DROP TABLE x; -- \n/*é*/"


def _statements(art, *cmds, no_backslash=False):
    applied = mariadb_net_change.as_applied(art)
    plan = net_change.net_changes(cmds, {art.name: applied})
    return mariadb_net_change._statements(applied, net_change.split(applied, plan[art.name]), no_backslash)


def test_deletes_come_first_by_key_then_updates_through_the_copy_then_one_multi_row_insert():
    art = text_article(dest_table=HOSTILE)
    out = _statements(
        art,
        Command(INSERT, "t", new=["5", "it's", None]),
        Command(UPDATE, "t", old=["1", "a", "b"], new=["1", "x\\y", "b"]),
        Command(DELETE, "t", old=["2", "a", "b"]),
        Command(DELETE, "t", old=["3", "a", "b"]),
        Command(INSERT, "t", new=["6", "z", "w"]),
    )
    table = "`t``; DROP TABLE x; -- \n/*é*/`"
    copy = f"`{mariadb_net_change.copy_name(art)}`"
    assert out == [
        (f"DELETE FROM {table} WHERE `id` IN ('2', '3')", 2, "DELETE of article 't'"),
        (f"DELETE FROM {copy}", None, "UPDATE of article 't'"),
        (f"INSERT INTO {copy} (`id`, `a`, `b`) VALUES ('1', 'x\\\\y', 'b')", None, ""),
        (
            f"UPDATE {table} AS t JOIN {copy} AS s ON t.`id` = s.`id` SET t.`id` = s.`id`, t.`a` = s.`a`, t.`b` = s.`b`",
            1,
            "UPDATE of article 't'",
        ),
        (
            f"INSERT INTO {table} (`id`, `a`, `b`) VALUES ('5', 'it\\'s', NULL), ('6', 'z', 'w')",
            None,
            "INSERT of article 't'",
        ),
    ]


def test_without_backslash_escapes_a_quote_is_doubled():
    out = _statements(text_article(), Command(INSERT, "t", new=["5", "it's", "a\\b"]), no_backslash=True)
    assert out[-1][0].endswith("VALUES ('5', 'it''s', 'a\\b')")


def test_a_generated_scall_procedure_updates_only_the_changed_columns_and_sql_statements_every_column():
    cmds = [
        Command(UPDATE, "t", old=["1", "a", "b"], new=["1", "x", "b"]),
        Command(UPDATE, "t", old=["2", "a", "b"], new=["2", "a", "b"]),  # changed nothing
    ]
    scall = text_article(update="SCALL sp_MSupd_publict")
    updates = [s for s, _, _ in _statements(scall, *cmds) if s.startswith("UPDATE")]
    assert [u.split(" SET ")[1] for u in updates] == ["t.`a` = s.`a`", "t.`id` = t.`id`"]
    statements = text_article()  # the unnamed default: an UPDATE statement of every column
    updates = [s for s, _, _ in _statements(statements, *cmds) if s.startswith("UPDATE")]
    assert [u.split(" SET ")[1] for u in updates] == ["t.`id` = s.`id`, t.`a` = s.`a`, t.`b` = s.`b`"]


def test_only_a_custom_procedure_or_none_makes_an_article_go_command_by_command():
    arts = [
        text_article(name="plain"),
        text_article(name="generated", update="MCALL sp_MSupd_publict"),
        text_article(name="custom", update="MCALL my_upd"),
        text_article(name="none", delete="NONE"),
        text_article(name="triggered", dest_table="trig"),
    ]
    paths = mariadb_net_change.article_paths("auto", arts, {("public", "trig"): ["audit"]})
    assert [(p.article, p.apply, p.why) for p in paths] == [
        (
            "plain",
            "net_change",
            "nothing at the subscriber (trigger, custom procedure, updating) can tell it from command by command",
        ),
        (
            "generated",
            "net_change",
            "nothing at the subscriber (trigger, custom procedure, updating) can tell it from command by command",
        ),
        ("custom", "per_command", "custom procedure"),
        ("none", "per_command", "delete propagated as NONE"),
        ("triggered", "per_command", "trigger(s) firing for replicated changes at the subscriber: audit"),
    ]


def test_several_streams_make_auto_go_command_by_command_and_net_change_keep_net_change():
    """As at a PostgreSQL subscriber: ``auto`` with several streams spreads each batch's commands
    over them; ``net_change`` applies the net change (on one stream)."""
    arts = [text_article(name="plain")]
    auto = mariadb_net_change.article_paths("auto", arts, {}, (), 3)
    assert [(p.apply, p.why) for p in auto] == [
        ("per_command", "subscription_streams 3 (batches spread over the streams)")
    ]
    net = mariadb_net_change.article_paths("net_change", arts, {}, (), 3)
    assert [(p.apply, p.why) for p in net] == [("net_change", "apply_mode net_change")]
