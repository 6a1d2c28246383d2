"""The plan's text and JSON forms and how it names differences (no server)."""

from __future__ import annotations

import json

from airflow_repl.engine.provisioning.plan import Action, Plan, _differences


def test_an_empty_plan_says_there_is_nothing_to_do():
    assert Plan().format_table() == "nothing to do: the servers match the topology"
    assert Plan().to_dict() == {"actions": [], "drops": 0}


def test_each_action_is_one_line_naming_its_publication_and_drops_are_counted():
    plan = Plan(
        [
            Action("drop", "subscription", "p", "s\n1", "gone", True),
            Action("create", "publication", "p", "p"),
            Action("alter", "article", "p", "a", "row_filter: 1 -> 2"),
        ]
    )
    lines = plan.format_table().splitlines()
    assert lines == [
        "drop subscription 's\\n1' of publication 'p': gone",
        "create publication 'p'",
        "alter article 'a' of publication 'p': row_filter: 1 -> 2",
    ]
    data = json.loads(plan.to_json())
    assert data["drops"] == 1 and [a["removes"] for a in data["actions"]] == [True, False, False]
    assert plan.drops == [plan.actions[0]]


def test_differences_name_each_changed_key_and_nested_key():
    old = {"options": {"a": 1, "b": 2}, "update_mode": "read only", "same": [1]}
    new = {"options": {"a": 1, "b": 3, "c": None}, "update_mode": "queued tran", "same": [1]}
    assert _differences(old, new) == 'options.b: 2 -> 3; update_mode: "read only" -> "queued tran"'
    assert _differences(old, old) == ""
