"""Where a replicated table lives, as asset URIs and OpenLineage name it, and what a
Distribution Agent run reports per subscriber table (no server)."""

from __future__ import annotations

import random
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_repl.engine.agents.distribution_agent import TableChanges
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.postgres.addresses import table_address
from airflow_repl.engine.state.dist_transactions import PendingTransaction


def test_asset_uri_and_lineage_name_of_a_table_never_carry_user_or_password():
    address = table_address("host=db.example port=5433 user=repl password=s3cret dbname=reporting", "public.orders")
    assert address.uri == "postgres://db.example:5433/reporting/public/orders"
    assert (address.namespace, address.name) == ("postgres://db.example:5433", "reporting.public.orders")
    uri = table_address("postgresql://repl:s3cret@db.example/reporting", "sales.order lines").uri
    assert uri == "postgres://db.example:5432/reporting/sales/order%20lines"
    assert "s3cret" not in uri and "repl" not in uri


@pytest.mark.parametrize(
    ("conninfo", "authority"),
    [
        ("host=/var/run/postgresql dbname=x", "localhost:5432"),  # a Unix socket: this machine
        ("dbname=x", "localhost:5432"),
        ("host=a,b port=6000,6001 dbname=x", "a:6000"),  # several hosts: the first
        ("host=::1 port=5434 dbname=x", "[::1]:5434"),
    ],
)
def test_authority_of_sockets_multiple_hosts_and_ipv6(conninfo, authority):
    assert table_address(conninfo, "s.t").authority == authority


def test_a_table_name_with_a_slash_keeps_the_uri_four_components_long():
    address = table_address("host=h dbname=d", "s.a/b")
    assert address.uri == "postgres://h:5432/d/s/a%2Fb" and address.name == "d.s.a/b"


def test_an_unparseable_connection_string_is_a_topology_error_without_its_text():
    with pytest.raises(TopologyError, match="cannot be parsed") as caught:
        table_address("host=h password='unterminated", "s.t")
    assert "unterminated" not in str(caught.value)


def _txn(xact: str, **rows: int) -> PendingTransaction:
    return PendingTransaction(xact, sum(rows.values()), rows, datetime(2026, 1, 1, tzinfo=timezone.utc))


def test_table_changes_count_transactions_row_changes_and_last_position_per_destination():
    tables = TableChanges({"orders": "public.orders", "lines": "sales.order_lines"})
    tables.add([_txn("0/10", orders=2), _txn("0/20", orders=1, lines=3)])
    tables.add([_txn("0/30", lines=1)])
    assert tables.summary() == {
        "public.orders": {"transactions": 2, "commands": 3, "last_xact_seqno": "0/20"},
        "sales.order_lines": {"transactions": 2, "commands": 4, "last_xact_seqno": "0/30"},
    }
    assert TableChanges({}).summary() == {}


def _old_table_changes(destinations: dict[str, str], batches: list[list[PendingTransaction]]) -> dict[str, Any]:
    """TableChanges.add before it counted article by article (the reference)."""
    tables: dict[str, dict[str, Any]] = {}
    for txns in batches:
        for txn in txns:
            for article, rows in txn.article_rows.items():
                seen = tables.setdefault(
                    destinations.get(article, article), {"transactions": 0, "commands": 0, "last_xact_seqno": None}
                )
                seen["transactions"] += 1
                seen["commands"] += rows
                seen["last_xact_seqno"] = txn.xact
    return {table: dict(seen) for table, seen in sorted(tables.items())}


@pytest.mark.parametrize("seed", range(20))
def test_table_changes_match_the_old_count_on_random_batches(seed: int) -> None:
    """Articles sharing a destination, articles without one, transactions changing several."""
    rng = random.Random(seed)
    destinations = {"a": "public.t", "b": "public.t", "c": "s.c"}
    position = 0
    batches = []
    for _ in range(rng.randrange(1, 6)):
        batch = []
        for _ in range(rng.randrange(1, 30)):
            position += 1
            chosen = rng.sample(["a", "b", "c", "d"], rng.randrange(1, 5))
            batch.append(_txn(f"0/{position:X}", **{name: rng.randrange(0, 4) for name in chosen}))
        batches.append(batch)
    tables = TableChanges(destinations)
    for batch in batches:
        tables.add(batch)
    assert tables.summary() == _old_table_changes(destinations, batches)
