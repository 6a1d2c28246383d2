"""``apply_mode`` without servers: the topology keys (publication default, subscription override,
``bulk_apply: true`` as the older spelling of ``net_change``) and each article's path with the reason it is given."""

from __future__ import annotations

import pytest
from article_builder import text_article

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import topology
from airflow_repl.engine.subscriber.bulk_apply import ArticlePath, article_paths


def topo(publication: dict | None = None, subscription: dict | None = None) -> topology.Topology:
    return topology.from_dict(
        {
            "publisher": "postgresql://u@127.0.0.1:1/pub",
            "distributor": "postgresql://u@127.0.0.1:1/dist",
            "subscribers": {"s1": "postgresql://u@127.0.0.1:1/s1"},
            "publications": [{"name": "p", "articles": ["public.items"], **(publication or {})}],
            "subscriptions": [{"publication": "p", "subscriber": "s1", **(subscription or {})}],
        }
    )


@pytest.mark.parametrize(
    ("publication", "subscription", "mode"),
    [
        ({}, {}, "auto"),
        ({"apply_mode": "per_command"}, {}, "per_command"),
        ({"apply_mode": "per_command"}, {"apply_mode": "auto"}, "auto"),
        ({}, {"apply_mode": "net_change"}, "net_change"),
        ({}, {"bulk_apply": True}, "net_change"),
        ({"apply_mode": "per_command"}, {"bulk_apply": True}, "net_change"),
        ({}, {"bulk_apply": False}, "auto"),
        ({"apply_mode": "per_command"}, {"bulk_apply": False}, "per_command"),
        ({}, {"bulk_apply": True, "apply_mode": "net_change"}, "net_change"),
    ],
)
def test_the_subscription_overrides_the_publication_and_bulk_apply_is_a_synonym(publication, subscription, mode):
    assert topo(publication, subscription).apply_mode("p", "s1") == mode


def test_apply_mode_is_written_back_only_where_the_file_sets_it():
    assert "apply_mode" not in topo().subscription("p", "s1").options()
    assert _again(topo({"apply_mode": "per_command"})).apply_mode("p", "s1") == "per_command"
    assert _again(topo(subscription={"bulk_apply": False})).apply_mode("p", "s1") == "auto"


def _again(topo: topology.Topology) -> topology.Topology:
    """The topology read back from its dictionary form (as the agents' spec file carries it)."""
    data = topo.to_dict()
    data.update(publisher="postgresql://u@127.0.0.1:1/pub", distributor="postgresql://u@127.0.0.1:1/dist")
    data["subscribers"] = {"s1": "postgresql://u@127.0.0.1:1/s1"}
    return topology.from_dict(data)
    assert topo(subscription={"apply_mode": "auto"}).subscription("p", "s1").options()["apply_mode"] == "auto"
    assert topo({"apply_mode": "net_change"}).to_dict()["publications"][0]["apply_mode"] == "net_change"
    assert "apply_mode" not in topo().to_dict()["publications"][0]


@pytest.mark.parametrize(
    ("where", "keys", "message"),
    [
        ("subscription", {"apply_mode": "per_command", "bulk_apply": True}, "keep apply_mode and remove bulk_apply"),
        ("subscription", {"apply_mode": "fast"}, "apply_mode"),
        ("publication", {"apply_mode": "net"}, "apply_mode"),
    ],
)
def test_a_bad_apply_mode_is_refused_naming_the_key(where, keys, message):
    with pytest.raises(TopologyError, match=message):
        topo(**{where: keys})


ART = text_article(name="orders", dest_table="orders")
CUSTOM = text_article(name="custom", dest_table="custom", update="CALL my.upd")
SQL = text_article(name="sql", dest_table="sql", insert="SQL", update="SQL", delete="SQL")
NONE = text_article(name="none", dest_table="none", delete="NONE")


def test_auto_goes_by_net_change_only_where_nothing_at_the_subscriber_can_tell():
    paths = article_paths(
        "auto",
        [ART, CUSTOM, SQL, NONE, text_article(name="watched", dest_table="w"), text_article(name="s", dest_table="s")],
        triggers={("public", "w"): ["'t1' (ENABLE ALWAYS)"], ("other", "orders"): ["'x' (ENABLE REPLICA)"]},
        scripts=["s"],
    )
    assert paths == [
        ArticlePath(
            "orders",
            "net_change",
            "nothing at the subscriber (trigger, custom procedure, updating) can tell it from command by command",
        ),
        ArticlePath("custom", "per_command", "custom procedure"),
        ArticlePath(
            "sql",
            "net_change",
            "nothing at the subscriber (trigger, custom procedure, updating) can tell it from command by command",
        ),
        ArticlePath("none", "per_command", "delete propagated as NONE"),
        ArticlePath(
            "watched", "per_command", "trigger(s) firing for replicated changes at the subscriber: 't1' (ENABLE ALWAYS)"
        ),
        ArticlePath("s", "per_command", "custom script registered"),
    ]
    assert paths[0].to_json() == {
        "article": "orders",
        "apply": "net_change",
        "why": "nothing at the subscriber (trigger, custom procedure, updating) can tell it from command by command",
    }


def test_an_updatable_subscriber_goes_command_by_command_under_auto_only():
    assert article_paths("auto", [ART], updatable="queued tran") == [
        ArticlePath("orders", "per_command", "updatable subscriber (queued tran)")
    ]
    assert article_paths("net_change", [ART, CUSTOM], updatable="sync tran") == [
        ArticlePath("orders", "net_change", "apply_mode net_change"),
        ArticlePath("custom", "per_command", "custom procedure"),
    ]


def test_several_streams_keep_spreading_batches_under_auto_only():
    assert article_paths("auto", [ART], streams=3) == [
        ArticlePath("orders", "per_command", "subscription_streams 3 (batches spread over the streams)")
    ]
    assert article_paths("net_change", [ART], streams=3)[0].apply == "net_change"


def test_per_command_takes_every_article_literally():
    assert {p.apply for p in article_paths("per_command", [ART, SQL])} == {"per_command"}
    assert article_paths("per_command", [ART])[0].why == "apply_mode per_command"
