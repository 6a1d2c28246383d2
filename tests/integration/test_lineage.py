"""The Airflow layer of assets and lineage without a server: which asset events a run's
summary becomes, the operators' outlets, and their OpenLineage inputs and outputs (the runs
themselves are in test_airflow_e2e.py)."""

from __future__ import annotations

import json

import pytest

from airflow_repl.engine.model.topology import from_dict

PUB = "host=pub.example port=5432 user=u password=s3cret dbname=shop"
SUB = "host=sub.example port=5433 user=u password=s3cret dbname=reporting"


@pytest.fixture
def topo():
    return from_dict(
        {
            "publisher": {"ref": "repl_publisher", "conninfo": PUB},
            "distributor": {"ref": "repl_distributor", "conninfo": PUB},
            "subscribers": {"reporting": {"ref": "repl_subscriber", "conninfo": SUB}},
            "publications": [
                {
                    "name": "shop",
                    "articles": [{"table": "public.orders"}, {"table": "public.lines", "destination": "rep.lines"}],
                }
            ],
            "subscriptions": [{"publication": "shop", "subscriber": "reporting"}],
        }
    )


def test_a_distribution_summary_becomes_one_event_per_changed_table(topo):
    from airflow_repl.operators import lineage

    summary = {
        "transactions": 3,
        "subscriptions": [
            {
                "subscriber": "reporting",
                "last_xact_seqno": "0/3000",
                "tables": {
                    "public.orders": {"transactions": 3, "commands": 7, "last_xact_seqno": "0/3000"},
                    "rep.lines": {"transactions": 0, "commands": 0, "last_xact_seqno": None},
                },
            }
        ],
    }
    changed = lineage.changed_tables("distribution", topo, "shop", summary)
    assert [(a.uri, e) for a, e in changed] == [
        (
            "postgres://sub.example:5433/reporting/public/orders",
            {
                "agent": "distribution",
                "publication": "shop",
                "subscriber": "reporting",
                "transactions": 3,
                "commands": 7,
                "watermark": "0/3000",
            },
        )
    ]
    assert "s3cret" not in json.dumps([(a.uri, e) for a, e in changed])
    empty = {"subscriptions": [{"subscriber": "reporting", "last_xact_seqno": None, "tables": {}}]}
    assert lineage.changed_tables("distribution", topo, "shop", empty) == []


def test_a_snapshot_summary_becomes_one_event_per_table_of_each_initialized_subscription(topo):
    from airflow_repl.operators import lineage

    summary = {
        "snapshot_id": "s1",
        "consistent_lsn": "0/1000",
        "initialized": ["reporting"],
        "tables": {"public.orders": 5, "rep.lines": 0},
    }
    changed = lineage.changed_tables("snapshot", topo, "shop", summary)
    assert {a.uri: (e["rows"], e["watermark"], e["snapshot_id"]) for a, e in changed} == {
        "postgres://sub.example:5433/reporting/public/orders": (5, "0/1000", "s1"),
        "postgres://sub.example:5433/reporting/rep/lines": (0, "0/1000", "s1"),
    }
    assert lineage.changed_tables("snapshot", topo, "shop", {**summary, "initialized": []}) == []


def test_operators_add_the_publication_alias_to_their_outlets():
    from airflow.sdk import Asset, AssetAlias

    from airflow_repl.operators.agents import DistributionAgentOperator, LogReaderAgentOperator, SnapshotAgentOperator

    mine = Asset("s3://bucket/marker")
    dist = DistributionAgentOperator(task_id="d", topology="t.yaml", publication="shop", outlets=[mine])
    assert dist.outlets == [mine, AssetAlias("airflow-repl:shop")]
    assert SnapshotAgentOperator(task_id="s", topology="t.yaml", publication="shop").outlets == [
        AssetAlias("airflow-repl:shop")
    ]
    assert LogReaderAgentOperator(task_id="l", topology="t.yaml", publication="shop").outlets == []


def test_openlineage_inputs_are_publisher_tables_and_outputs_subscriber_tables(topo):
    from airflow.providers.common.compat.openlineage.facet import OutputDataset

    from airflow_repl.operators import lineage

    ol = lineage.operator_lineage(topo, "shop", ["reporting"])
    assert [(d.namespace, d.name) for d in ol.inputs] == [
        ("postgres://pub.example:5432", "shop.public.orders"),
        ("postgres://pub.example:5432", "shop.public.lines"),
    ]
    assert [(d.namespace, d.name) for d in ol.outputs] == [
        ("postgres://sub.example:5433", "reporting.public.orders"),
        ("postgres://sub.example:5433", "reporting.rep.lines"),
    ]
    counted = lineage.operator_lineage(
        topo, "shop", ["reporting"], {"postgres://sub.example:5433/reporting/public/orders": 7}
    )
    orders = counted.outputs[0]
    assert isinstance(orders, OutputDataset) and orders.outputFacets["outputStatistics"].rowCount == 7
    assert not isinstance(counted.outputs[1], OutputDataset)
