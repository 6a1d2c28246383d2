"""Downstream of replication: a DAG scheduled on a replicated table.

The Distribution Agent's operator emits an asset event for every subscriber table that received
changes in its run (and the Snapshot Agent's for every table it initialized), named by the
table's Postgres asset URI ``postgres://host:port/database/schema/table``.  This DAG is scheduled
on the subscriber's ``public.orders``: it runs after a replication cycle that changed that table,
and not after one that delivered nothing to it.  Its task reads what each triggering event
carries in its extra: the transactions and commands (row changes) delivered to the table and
the subscription's watermark after the run (the table has every change up to that position);
after a snapshot, the rows loaded and the snapshot's position.

The URI comes from ``AIRFLOW_REPL_ORDERS_ASSET`` (repl_common.py); ``make demo`` and the tests
set it for their sandbox.  To wait for any table of the publication instead, schedule on the
alias: ``schedule=[AssetAlias("airflow-repl:shop")]``.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Asset, task
from repl_common import REPLICATED_ORDERS

with DAG(
    dag_id="airflow_repl_on_replicated_orders",
    description="Runs when replication changed the subscriber's public.orders",
    schedule=[Asset(REPLICATED_ORDERS)],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-repl", "example"],
) as dag:

    @task
    def changes_received(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """One line per triggering event: the table, then what the event's extra says."""
        received = [
            {"table": asset.uri, **event.extra}
            for asset, events in (triggering_asset_events or {}).items()
            for event in events
        ]
        for change in received:  # distribution: transactions, commands; snapshot: rows, snapshot_id
            print(f"{change['table']} changed by the {change.get('agent')} agent: {change}")
        return received

    changes_received()
