"""Updatable subscriptions in the topology model: publication options, conflict policies, update
modes and the static rules between them (no server)."""

from __future__ import annotations

import json

import pytest

from airflow_repl.engine.codegen import updating_scripts
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import topology
from airflow_repl.engine.model.updating import ConflictPolicy, UpdateMode, parse_conflict_policy, parse_update_mode


def _data(pub: dict | None = None, sub: dict | None = None) -> dict:
    return {
        "publisher": "pub_conn",
        "distributor": "dist_conn",
        "subscribers": {"s1": "sub_conn"},
        "publications": [{"name": "shop", "articles": ["public.orders"], **(pub or {})}],
        "subscriptions": [{"publication": "shop", "subscriber": "s1", **(sub or {})}],
    }


def _error(data: dict) -> str:
    with pytest.raises(TopologyError) as err:
        topology.from_dict(data)
    message = str(err.value)
    assert "\n" not in message and message.startswith("topology: ")
    return message


def test_defaults_read_only_publication_not_updatable():
    topo = topology.from_dict(_data())
    pub = topo.publication("shop")
    assert (pub.allow_sync_tran, pub.allow_queued_tran, pub.conflict_policy) == (False, False, ConflictPolicy.PUB_WINS)
    assert not pub.updatable
    assert topo.subscription("shop", "s1").update_mode is UpdateMode.READ_ONLY


@pytest.mark.parametrize(
    "text, policy",
    [
        ("pub wins", ConflictPolicy.PUB_WINS),
        ("Publisher Wins", ConflictPolicy.PUB_WINS),
        ("sub wins", ConflictPolicy.SUB_WINS),
        ("SUBSCRIBER WINS", ConflictPolicy.SUB_WINS),
        ("sub reinit", ConflictPolicy.SUB_REINIT),
        ("publisher wins and reinitialize", ConflictPolicy.SUB_REINIT),
        ("  publisher   wins and  Reinitialize ", ConflictPolicy.SUB_REINIT),
    ],
)
def test_conflict_policy_spellings(text, policy):
    assert parse_conflict_policy(text) is policy
    pub = topology.from_dict(_data({"allow_queued_tran": True, "conflict_policy": text})).publication("shop")
    assert pub.conflict_policy is policy


@pytest.mark.parametrize("value", ["publisher", "pub_wins", 1, True, None])
def test_unknown_conflict_policy_names_the_choices(value):
    message = _error(_data({"allow_queued_tran": True, "conflict_policy": value}))
    assert "publications[0].conflict_policy" in message
    assert "'pub wins' (publisher wins)" in message and "'sub reinit' (publisher wins and reinitialize)" in message


def test_conflict_policy_without_queued_updating_is_an_error():
    message = _error(_data({"allow_sync_tran": True, "conflict_policy": "sub wins"}))
    assert "publications[0].conflict_policy" in message
    assert "add 'allow_queued_tran: true' or remove conflict_policy" in message


@pytest.mark.parametrize("mode", list(UpdateMode))
def test_update_mode_spellings(mode):
    assert parse_update_mode(str(mode).upper()) is mode
    sub = topology.from_dict(_data({"allow_sync_tran": True, "allow_queued_tran": True}, {"update_mode": str(mode)}))
    assert sub.subscription("shop", "s1").update_mode is mode


def test_update_mode_properties():
    assert {m for m in UpdateMode if m.queued} == {UpdateMode.QUEUED_TRAN, UpdateMode.QUEUED_FAILOVER}
    assert {m for m in UpdateMode if m.immediate} == {UpdateMode.SYNC_TRAN, UpdateMode.FAILOVER}
    assert {m for m in UpdateMode if m.failover} == {UpdateMode.FAILOVER, UpdateMode.QUEUED_FAILOVER}
    assert [m for m in UpdateMode if not m.updatable] == [UpdateMode.READ_ONLY]


@pytest.mark.parametrize("value", ["queued", "immediate", "read-only", 3, None])
def test_unknown_update_mode_names_the_choices(value):
    message = _error(_data({"allow_queued_tran": True}, {"update_mode": value}))
    assert "subscriptions[0].update_mode" in message
    assert "'read only', 'sync tran', 'queued tran', 'failover', 'queued failover'" in message


@pytest.mark.parametrize(
    "pub, mode, missing",
    [
        ({}, "queued tran", "allow_queued_tran: true"),
        ({"allow_sync_tran": True}, "queued tran", "allow_queued_tran: true"),
        ({"allow_queued_tran": True}, "sync tran", "allow_sync_tran: true"),
        ({"allow_queued_tran": True}, "failover", "allow_sync_tran: true"),
        ({"allow_sync_tran": True}, "failover", "allow_queued_tran: true"),
        ({"allow_queued_tran": True}, "queued failover", "allow_sync_tran: true"),
        ({}, "queued failover", "allow_sync_tran: true and allow_queued_tran: true"),
    ],
)
def test_update_mode_needs_the_publication_to_allow_it(pub, mode, missing):
    message = _error(_data(pub, {"update_mode": mode}))
    assert "subscriptions[0].update_mode" in message
    assert f"update_mode {mode!r}, which publication 'shop' does not allow: set {missing}" in message


def test_update_mode_error_in_a_file_names_line_and_column(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "publisher: pub_conn\ndistributor: dist_conn\nsubscribers: {s1: sub_conn}\n"
        "publications:\n  - name: shop\n    articles: [orders]\n"
        "subscriptions:\n  - publication: shop\n    subscriber: s1\n    update_mode: queued tran\n"
    )
    with pytest.raises(TopologyError) as err:
        topology.load(path)
    assert str(err.value).startswith(f"topology file {path}:10:18: subscriptions[0].update_mode: ")


def test_allow_options_are_strict_booleans():
    message = _error(_data({"allow_queued_tran": "yes"}))
    assert "publications[0].allow_queued_tran: expected true or false" in message


def test_read_only_subscription_of_an_updatable_publication_is_fine():
    topo = topology.from_dict(_data({"allow_sync_tran": True, "allow_queued_tran": True}))
    assert topo.publication("shop").updatable
    assert topo.subscription("shop", "s1").update_mode is UpdateMode.READ_ONLY


def test_unknown_key_hint_offers_the_new_keys():
    message = _error(_data({"allow_queued": True}))
    assert "did you mean 'allow_queued_tran'?" in message


@pytest.mark.parametrize(
    "pub, sub",
    [
        ({}, {}),
        (
            {"allow_queued_tran": True, "conflict_policy": "publisher wins and reinitialize"},
            {"update_mode": "queued tran"},
        ),
        (
            {"allow_sync_tran": True, "allow_queued_tran": True, "conflict_policy": "sub wins"},
            {"update_mode": "failover"},
        ),
        ({"allow_sync_tran": True}, {"update_mode": "sync tran"}),
    ],
)
def test_to_dict_round_trips_through_json(pub, sub):
    topo = topology.from_dict(_data(pub, sub))
    spec = json.loads(json.dumps(topo.to_dict()))
    again = topology.from_dict(spec)
    assert again.publication("shop") == topo.publication("shop")
    assert again.subscription("shop", "s1") == topo.subscription("shop", "s1")
    assert again.to_dict() == spec


def test_options_and_to_dict_write_the_file_spellings():
    topo = topology.from_dict(
        _data({"allow_queued_tran": True, "conflict_policy": "Subscriber Wins"}, {"update_mode": "Queued Tran"})
    )
    spec = topo.to_dict()
    assert spec["publications"][0]["conflict_policy"] == "sub wins"
    assert spec["publications"][0]["allow_queued_tran"] is True
    assert spec["subscriptions"][0]["update_mode"] == "queued tran"
    assert "update_mode" not in topo.subscription("shop", "s1").options()  # the Distribution Agent's options
    assert "conflict_policy" not in topology.from_dict(_data()).to_dict()["publications"][0]


def test_row_version_scripts_quote_every_identifier():
    script = updating_scripts.table_row_version_script('My "Schema"', "odd table")
    assert (
        'ALTER TABLE "My ""Schema"""."odd table" ADD COLUMN IF NOT EXISTS "msrepl_tran_version" uuid NOT NULL' in script
    )
    assert (
        'CREATE TRIGGER "airflow_repl_tran_version" BEFORE UPDATE ON "My ""Schema"""."odd table" FOR EACH ROW' in script
    )
    assert 'EXECUTE FUNCTION "airflow_repl"."tran_version"()' in script
    assert updating_scripts.ROW_VERSION_COLUMN == "msrepl_tran_version"
