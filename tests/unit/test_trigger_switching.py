"""The one statement that switches a table's triggers on or off, with hostile names."""

from __future__ import annotations

import pytest

from airflow_repl.engine.postgres.trigger_switching import switch_triggers

HOSTILE = 'we"ird\nschema -- /* go'


def test_every_identifier_is_quoted_and_each_trigger_switched():
    text = switch_triggers(HOSTILE, "tablé", ["a", 'b"c'], enabled=False).as_string(None)
    assert text == 'ALTER TABLE "we""ird\nschema -- /* go"."tablé" DISABLE TRIGGER "a", DISABLE TRIGGER "b""c"'
    on = switch_triggers("s", "t" * 63, ["x"], enabled=True).as_string(None)
    assert on == f'ALTER TABLE "s"."{"t" * 63}" ENABLE TRIGGER "x"'


def test_no_trigger_is_refused():
    with pytest.raises(ValueError, match="no trigger to switch"):
        switch_triggers("s", "t", [], enabled=True)
