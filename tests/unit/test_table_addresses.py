"""Where a replicated table lives, as asset URIs and OpenLineage name it, and what a
Distribution Agent run reports per subscriber table (no server)."""

from __future__ import annotations

from datetime import datetime, timezone

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
