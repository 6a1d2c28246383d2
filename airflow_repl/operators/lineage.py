"""Asset events and OpenLineage datasets of the agents' operators.

A Snapshot or Distribution Agent run changes tables at subscribers; each such table is an
Airflow asset named by its Postgres asset URI (``postgres://host:port/database/schema/table``,
:mod:`~airflow_repl.engine.postgres.addresses`).  The operator declares one
:class:`~airflow.sdk.AssetAlias` per publication (:func:`asset_alias`) among its outlets and, when
the run succeeds, adds to it one asset event per table that received changes
(:func:`changed_tables`, :func:`emit`), with what it received in the event's ``extra`` (no
password: the URI has none, the extra holds counts and positions).

OpenLineage (:func:`operator_lineage`): inputs are the publication's tables at the publisher,
outputs the articles' tables at the subscribers the run serves.  The OpenLineage classes are
imported inside the functions, as the provider's guide asks, so that nothing here needs the
OpenLineage provider unless lineage is collected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias

from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres.addresses import TableAddress, table_address

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

#: The asset alias of a publication's replicated tables: ``airflow-repl:<publication>``.
ALIAS_PREFIX = "airflow-repl:"


def asset_alias(publication: str) -> AssetAlias:
    """The alias the operators of ``publication`` add their asset events to (a DAG scheduled on
    it runs when any of the publication's subscriber tables changed)."""
    return AssetAlias(name=f"{ALIAS_PREFIX}{publication}")


def is_templated(value: str) -> bool:
    """Whether ``value`` holds a Jinja expression or statement (rendered when the task runs)."""
    return "{{" in value or "{%" in value


def changed_tables(
    agent: str, topo: Topology, publication: str, summary: dict[str, Any]
) -> list[tuple[TableAddress, dict[str, Any]]]:
    """Each subscriber table the run changed, with its asset event's extra: for the
    Distribution Agent the tables that received transactions (``transactions``, ``commands``:
    row changes, ``watermark``: the subscription's position after the run, through which the
    table now has every change), for the Snapshot Agent every table of each subscription it
    initialized (``rows``, ``snapshot_id``, ``watermark``: the snapshot's consistent LSN)."""
    base = {"agent": agent, "publication": publication}
    if agent == "distribution":
        return [
            (table_address(topo.subscriber_conninfo(sub["subscriber"]), table), extra)
            for sub in summary.get("subscriptions", [])
            for table, extra in _delivered(base, sub)
        ]
    if agent == "snapshot":
        return [
            (table_address(topo.subscriber_conninfo(name), table), extra)
            for name in summary.get("initialized", [])
            for table, extra in _initialized(base, name, summary)
        ]
    return []


def _delivered(base: dict[str, Any], sub: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(table, extra) of each table one subscription's delivery changed."""
    return [
        (
            table,
            {
                **base,
                "subscriber": sub["subscriber"],
                "transactions": seen["transactions"],
                "commands": seen["commands"],
                "watermark": sub["last_xact_seqno"],
            },
        )
        for table, seen in sub.get("tables", {}).items()
        if seen["transactions"]
    ]


def _initialized(base: dict[str, Any], subscriber: str, summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(table, extra) of each table of a subscription the snapshot initialized."""
    at = {"snapshot_id": summary["snapshot_id"], "watermark": summary["consistent_lsn"]}
    return [
        (table, {**base, "subscriber": subscriber, "rows": rows, **at})
        for table, rows in summary.get("tables", {}).items()
    ]


def emit(context: Any, alias: AssetAlias, changed: list[tuple[TableAddress, dict[str, Any]]]) -> None:
    """Add one asset event per changed table to ``alias`` (one of the task's outlets)."""
    events = context["outlet_events"][alias]
    for address, extra in changed:
        events.add(Asset(address.uri), extra=extra)


def served_subscribers(topo: Topology, publication: str, subscribers: list[str] | None) -> list[str]:
    """The subscribers a run serves: those named, else every subscription of the publication."""
    return list(subscribers or [s.subscriber for s in topo.subscriptions_of(publication)])


def operator_lineage(
    topo: Topology, publication: str, subscribers: list[str], rows: dict[str, int] | None = None
) -> OperatorLineage:
    """OpenLineage inputs (the publication's tables at the publisher) and outputs (its articles'
    tables at ``subscribers``); ``rows``: row counts per output asset URI, reported as the
    outputs' ``outputStatistics`` facet."""
    from airflow.providers.common.compat.openlineage.facet import (
        Dataset,
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
    )
    from airflow.providers.openlineage.extractors import OperatorLineage

    articles = topo.publication(publication).articles
    publisher = topo.publisher.require("publisher")
    sources = [table_address(publisher, a.table) for a in articles]
    targets = [table_address(topo.subscriber_conninfo(s), a.destination) for s in subscribers for a in articles]

    def output(address: TableAddress) -> Dataset:
        if rows is None or address.uri not in rows:
            return Dataset(namespace=address.namespace, name=address.name)
        facet = OutputStatisticsOutputDatasetFacet(rowCount=rows[address.uri])
        return OutputDataset(namespace=address.namespace, name=address.name, outputFacets={"outputStatistics": facet})

    return OperatorLineage(
        inputs=[Dataset(namespace=a.namespace, name=a.name) for a in sources],
        outputs=[output(a) for a in targets],
    )


def rows_per_table(changed: list[tuple[TableAddress, dict[str, Any]]]) -> dict[str, int]:
    """Rows written per asset URI (commands for the Distribution Agent, rows for the Snapshot
    Agent), for the outputs' statistics."""
    return {address.uri: int(extra.get("commands", extra.get("rows", 0))) for address, extra in changed}
