"""The pure parts of pausing: the resume command and messages (names quoted for a shell), the
state ``status`` shows and its expiry warning."""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta, timezone

from airflow_repl.engine.monitoring import status
from airflow_repl.engine.provisioning import pausing
from airflow_repl.engine.state.progress import SubscriptionRow
from airflow_repl.engine.state.retention import expired_message
from airflow_repl.presentation import status_table

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


def test_the_resume_command_survives_hostile_names():
    for pub, sub in [("p", "sub1"), ("shop's", "a b;rm -rf /"), ("go\n--x", "/*ü*/"), ("p" * 63, "$(id)")]:
        words = shlex.split(pausing.resume_command(pub, sub))
        assert words == ["airflow-repl", "resume", "-t", "TOPOLOGY", "-p", pub, "--subscriber", sub]
    message = pausing.paused_message("p", "sub1")
    assert "subscriber 'sub1' to publication 'p' is paused: nothing was delivered" in message
    assert message.endswith("resume it with: airflow-repl resume -t TOPOLOGY -p p --subscriber sub1")
    assert "3 transaction(s) delivered before the pause" in pausing.paused_message("p", "sub1", 3)


def test_the_resume_command_parses_once_the_topology_is_named():
    # the suggested command had no -t: pasted as printed, it failed on the required --topology
    from airflow_repl.cli import build_parser

    words = shlex.split(pausing.resume_command("shop", "reporting"))
    args = build_parser().parse_args([w.replace("TOPOLOGY", "dags/demo_topology.yaml") for w in words[1:]])
    assert (args.topology, args.publication, args.subscriber) == ("dags/demo_topology.yaml", "shop", "reporting")


def test_expired_message_says_paused_and_that_it_stays_paused():
    assert "it was not synchronized" in expired_message("p", "s1") and "paused" not in expired_message("p", "s1")
    paused = expired_message("p", "s1", paused=True)
    assert "it was paused and not synchronized" in paused and "it stays paused" in paused


def _row(state: str = "active", paused: bool = False, waiting: bool = True) -> SubscriptionRow:
    return SubscriptionRow("p", "s1", state, "0/10", T0, 2, 4, T0, T0 if waiting else None, paused)


def test_status_shows_paused():
    assert status.state(_row()) == "active"
    assert status.state(_row(paused=True)) == "paused"
    assert status.state(_row("pending", paused=True)) == "pending, paused"
    line = status_table.format_table(
        [status.SubscriptionStatus(_row(paused=True), None, None, None, None)]
    ).splitlines()[1]
    assert line.split()[:3] == ["p", "s1", "paused"]
    data = status.SubscriptionStatus(_row(paused=True), None, None, None, None).to_json()
    assert (data["status"], data["paused"], data["warning"]) == ("paused", True, None)


def test_expiry_warning_after_80_percent_of_max_retention():
    row = _row(paused=True)
    expiry = status.expires_at(row, 72.0)
    assert expiry == T0 + timedelta(hours=72)
    assert status.expiry_warning(row, expiry, 72.0, T0 + timedelta(hours=57)) is None  # 79%
    warning = status.expiry_warning(row, expiry, 72.0, T0 + timedelta(hours=58))  # 80.6%
    assert warning is not None and "(paused) expires at 2026-11-26T12:00:00+00:00" in warning
    assert (
        "more than 80% of max_retention_hours (72)" in warning
        and "airflow-repl resume -t TOPOLOGY -p p --subscriber s1" in warning
    )
    active = status.expiry_warning(_row(), expiry, 72.0, T0 + timedelta(hours=70))
    assert active is not None and "run the Distribution Agent for it" in active and "resume" not in active
    assert status.expiry_warning(_row(waiting=False), status.expires_at(_row(waiting=False), 72.0), 72.0, T0) is None
    table = status_table.format_table([status.SubscriptionStatus(row, None, None, None, expiry, warning)])
    assert table.splitlines()[-1] == f"warning: {warning}"
