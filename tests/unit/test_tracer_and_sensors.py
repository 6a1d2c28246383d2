"""Tracer tokens and the quiescing checks without servers: the token message, the latency table
and the wait status's message (the Airflow side is tested in
``tests/integration/test_quiescing_sensors.py``)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model.topology import from_dict
from airflow_repl.engine.monitoring import quiescing, tracer
from airflow_repl.engine.state import progress

T0 = datetime(2026, 11, 23, 12, 0, 0, tzinfo=timezone.utc)


def test_token_message_parses_and_garbage_is_ignored():
    content = json.dumps({"token_id": 7, "publication": "p", "posted_at": T0.isoformat()}).encode()
    assert progress.parse_token(content) == progress.TokenMessage(7, "p", T0)
    for bad in (b"not json", b"{}", b'{"token_id": "x", "publication": "p", "posted_at": "now"}', b"\xff"):
        assert progress.parse_token(bad) is None


def latency(sub: str, read: bool, arrived: bool) -> tracer.Latency:
    d = T0 + timedelta(seconds=1.5) if read else None
    s = T0 + timedelta(seconds=2.25) if arrived else None
    return tracer.Latency(3, sub, T0, d, s, tracer._seconds(T0, d), tracer._seconds(d, s), tracer._seconds(T0, s))


def test_history_table_shows_each_hop_and_pending():
    lines = tracer.format_history([latency("sub1", True, True), latency("sub2", True, False)]).splitlines()
    assert lines[0].split()[:2] == ["token", "subscriber"]
    assert lines[1].split()[-6:] == ["1.500", "s", "0.750", "s", "2.250", "s"]
    assert lines[2].split()[-3:] == ["s", "pending", "pending"] and "1.500 s" in lines[2]
    rows = json.loads(tracer.history_json([latency("sub2", False, False)]))
    assert rows[0]["publisher_to_distributor"] is None and rows[0]["posted_at"] == T0.isoformat()


def test_wait_status_message_names_everything_behind():
    done = quiescing.WaitStatus("p", "0/10", ())
    assert done.done and done.message == "publication 'p' is caught up to 0/10"
    lags = (
        quiescing.Lag("sub1", 3, quiescing.DISTRIBUTION, "sub1 behind: run the Distribution Agent for sub1"),
        quiescing.Lag("sub2", 1, quiescing.QUEUE_READER, "sub2 queue: run the Queue Reader Agent"),
    )
    status = quiescing.WaitStatus("p", "0/10", lags)
    assert not status.done
    assert status.message == "sub1 behind: run the Distribution Agent for sub1; sub2 queue: run the Queue Reader Agent"


def test_a_quiesce_check_needs_exactly_one_of_position_and_token():
    topo = from_dict(
        {
            "publisher": "postgresql://u@h/pub",
            "distributor": "postgresql://u@h/dist",
            "subscribers": {"s": "postgresql://u@h/sub"},
            "publications": [{"name": "p", "articles": ["public.t"]}],
            "subscriptions": [{"publication": "p", "subscriber": "s"}],
        }
    )
    with pytest.raises(ReplError, match="exactly one"):
        quiescing.check_quiesced(topo, "p")
    with pytest.raises(ReplError, match="exactly one"):
        quiescing.check_quiesced(topo, "p", position="0/1", token_id=1)
