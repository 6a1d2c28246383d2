"""The outcome a stopped run records (``blocked`` for a refusal, ``failed`` for an error) and
``status``'s one rule that both fail it."""

from __future__ import annotations

import pytest

from airflow_repl.engine import errors
from airflow_repl.engine.model.ddl import SchemaChangeError
from airflow_repl.engine.monitoring.status import run_failed
from airflow_repl.engine.runtime.lifecycle import outcome_of
from airflow_repl.presentation.status_rows import run_state


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (errors.ReplError("articles changed"), "blocked"),
        (errors.NotInitialized("run the Snapshot Agent"), "blocked"),
        (errors.TopologyError("unknown table"), "blocked"),
        (SchemaChangeError("a schema change in flight"), "blocked"),
        (errors.DeliveryError("duplicate key"), "failed"),
        (errors.ConnectionFailed("cannot connect"), "failed"),
        (errors.ConnectionLost("lost"), "failed"),
        (errors.AgentBusy("busy"), "failed"),
        (RuntimeError("a bug"), "failed"),
    ],
)
def test_outcome_of_a_stopped_run(exc, outcome):
    assert outcome_of(exc) == outcome


@pytest.mark.parametrize(
    ("outcome", "failed"), [("blocked", True), ("failed", True), ("paused", False), ("succeeded", False)]
)
def test_blocked_fails_status_and_is_drawn_bad(outcome, failed):
    assert run_failed(outcome) is failed
    assert (run_state(outcome) == "bad") is failed
