"""Retention without servers: the cleanup's settings and batch cutting, the topology's
retention keys, the WAL-retention verdict and its messages, and the CLI's refusals."""

from __future__ import annotations

import math

import pytest

from airflow_repl import cli
from airflow_repl.engine.agents.cleanup_agent import deletable_prefix, retention_settings
from airflow_repl.engine.errors import ReplError, TopologyError
from airflow_repl.engine.model import topology
from airflow_repl.engine.monitoring.wal_retention import MB, WalRetention, wal_limit
from airflow_repl.engine.state.retention import Candidate, expired_message


def topo(**publication_keys: object) -> topology.Topology:
    return topology.from_dict(
        {
            "publisher": "postgresql://u@127.0.0.1:1/pub",
            "distributor": "postgresql://u@127.0.0.1:1/dist",
            "subscribers": {"s1": "postgresql://u@127.0.0.1:1/s1"},
            "publications": [{"name": "p", "articles": ["public.items"], **publication_keys}],
            "subscriptions": [{"publication": "p", "subscriber": "s1"}],
        }
    )


# ---------------------------------------------------------------------- settings
def test_retention_defaults_are_sql_servers_and_topology_keys_and_flags_override():
    r = retention_settings(topo(), "p")
    assert (r.min_hours, r.max_hours) == (0.0, 72.0)
    keyed = topo(min_retention_hours=2, max_retention_hours=48.5)
    assert (retention_settings(keyed, "p").min_hours, retention_settings(keyed, "p").max_hours) == (2.0, 48.5)
    over = retention_settings(keyed, "p", min_hours=1, max_hours=10)
    assert (over.min_hours, over.max_hours) == (1.0, 10.0)


@pytest.mark.parametrize(
    ("low", "high", "message"),
    [
        (-1, None, "minimum retention -1 is not a number of hours >= 0"),
        (None, -0.5, "maximum retention -0.5 is not a number of hours >= 0"),
        (math.nan, None, "minimum retention nan"),
        (None, math.inf, "maximum retention inf"),
        (None, 0, "maximum retention is 0 hours"),
        (80, None, r"minimum retention \(80 h\) is above the maximum retention \(72.0 h\)"),
        (True, None, "minimum retention True"),
    ],
)
def test_bad_retention_is_one_clear_error(low, high, message):
    with pytest.raises(ReplError, match=message) as info:
        retention_settings(topo(), "p", low, high)
    assert "\n" not in str(info.value)


def test_unknown_publication_is_refused():
    with pytest.raises(TopologyError, match="unknown publication 'nope'"):
        retention_settings(topo(), "nope")


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"min_retention_hours": -1}, "min_retention_hours: -1 is out of range"),
        ({"max_retention_hours": 0}, "max_retention_hours: 0 is out of range"),
        ({"min_retention_hours": 5, "max_retention_hours": 2}, "above max_retention_hours 2.0"),
        ({"max_slot_wal_mb": 0}, "max_slot_wal_mb: 0 is out of range"),
        ({"max_slot_wal_mb": 1.5}, "max_slot_wal_mb: expected an integer"),
        ({"min_retention_hours": "1"}, "min_retention_hours"),
    ],
)
def test_topology_retention_keys_are_checked(keys, message):
    with pytest.raises(TopologyError, match=message):
        topo(**keys)


def test_topology_retention_keys_travel_to_the_spark_job_only_when_written():
    plain = topo().to_dict()["publications"][0]
    assert not {"min_retention_hours", "max_retention_hours", "max_slot_wal_mb"} & plain.keys()
    keyed = topo(min_retention_hours=1, max_slot_wal_mb=512)
    again = topology.from_dict(keyed.to_dict(with_secrets=True)).publication("p")
    assert (again.min_retention_hours, again.max_retention_hours, again.max_slot_wal_mb) == (1.0, 72.0, 512)


# ---------------------------------------------------------------------- batches
def c(xact: int, commands: int, ok: bool = True) -> Candidate:
    return Candidate(f"0/{xact:X}", commands, ok)


def test_a_batch_is_the_leading_deletable_transactions_within_the_command_budget():
    rows = [c(1, 2), c(2, 3), c(3, 1), c(4, 1, ok=False), c(5, 1)]
    assert [r.xact for r in deletable_prefix(rows, 5)] == ["0/1", "0/2"]
    assert [r.xact for r in deletable_prefix(rows, 100)] == ["0/1", "0/2", "0/3"]  # stops at the first kept one
    assert [r.xact for r in deletable_prefix([c(1, 50), c(2, 1)], 10)] == ["0/1"]  # a large one goes alone
    assert deletable_prefix([c(1, 1, ok=False), c(2, 1)], 10) == []
    assert deletable_prefix([], 10) == []
    assert [r.xact for r in deletable_prefix([c(1, 0), c(2, 0), c(3, 0)], 1)] == ["0/1", "0/2", "0/3"]


# ---------------------------------------------------------------------- WAL retention
def test_wal_retention_verdict_and_messages():
    below = WalRetention("p", "slot_p", 3 * MB, 4)
    assert not below.exceeded and below.retained_mb == 3.0
    assert "retains 3.0 MB of WAL at the publisher (limit: 4 MB)" in below.message()
    above = WalRetention("p", "slot_p", 4 * MB + 1, 4)
    assert above.exceeded
    assert "above its limit of 4 MB (max_slot_wal_mb): run the Log Reader Agent" in above.message()
    assert not WalRetention("p", "slot_p", 10**12, None).exceeded  # no limit, never exceeded
    assert above.to_dict() == {
        "publication": "p",
        "slot": "slot_p",
        "retained_bytes": 4 * MB + 1,
        "limit_mb": 4,
        "retained_mb": 4.0,
        "exceeded": True,
    }


def test_wal_limit_comes_from_the_caller_or_the_publication():
    assert wal_limit(topo(), "p") is None
    assert wal_limit(topo(max_slot_wal_mb=64), "p") == 64
    assert wal_limit(topo(max_slot_wal_mb=64), "p", 8) == 8
    for bad in (0, -3, True):
        with pytest.raises(ReplError, match="not a whole number of MB >= 1"):
            wal_limit(topo(), "p", bad)


def test_expired_message_names_the_subscription_and_the_fix():
    text = expired_message("p", "s1")
    assert "subscriber 's1' to publication 'p' expired" in text
    assert "airflow-repl snapshot -p p --subscriber s1 --reinitialize" in text


# ---------------------------------------------------------------------- CLI
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ["--min-retention", "-1"],
            64,
            "airflow-repl: error: cleanup: argument --min-retention: '-1' is not a number >= 0",
        ),
        (["-p", "nope"], 2, "airflow-repl: error: unknown publication 'nope'"),
        (["--min-retention", "x"], 64, "argument --min-retention: 'x' is not a number >= 0"),
        (["--min-retention", "2", "--max-retention", "1"], 2, "the minimum retention (2.0 h) is above the maximum"),
    ],
)
def test_cli_cleanup_bad_input_is_one_line_before_any_connection(tmp_path, capsys, args, code, message):
    path = tmp_path / "t.yaml"
    path.write_text(
        "publisher: postgresql://u@127.0.0.1:1/pub\ndistributor: postgresql://u@127.0.0.1:1/dist\n"
        "publications: [{name: p, articles: [public.items]}]\n"
    )
    assert cli.main(["cleanup", "-t", str(path), *args]) == code
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
