"""SIGINT and SIGTERM as a stop flag for long-running loops, without a server (the cancelled
statements are tested against real servers: test_continuous.py, test_immediate_updating.py)."""

from __future__ import annotations

import os
import signal
import threading
import time

import psycopg
import pytest

from airflow_repl.engine.errors import DeliveryError
from airflow_repl.engine.postgres.stop_signals import SLICE, StopSignals, cancelled


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_is_a_flag_that_ends_a_wait_and_the_handlers_come_back(signum):
    before = signal.getsignal(signum)
    with StopSignals() as stop:
        threading.Timer(0.3, os.kill, (os.getpid(), signum)).start()
        started = time.monotonic()
        assert stop.wait(30) is True  # no KeyboardInterrupt, no exit: the wait ends
        assert time.monotonic() - started < 0.3 + 2 * SLICE
        assert stop.received == signal.Signals(signum).name and stop.stopped()
        stop.request("later")  # the first reason is kept
        assert stop.received == signal.Signals(signum).name
    assert signal.getsignal(signum) is before


def test_a_wait_ends_when_what_it_waits_for_comes_and_otherwise_at_its_end():
    with StopSignals() as stop:
        calls: list[float] = []
        assert stop.wait(5, lambda seconds: calls.append(seconds) or len(calls) == 3) is False
        assert len(calls) == 3 and all(0 < s <= SLICE for s in calls)
        started = time.monotonic()
        assert stop.wait(0.3) is False and time.monotonic() - started >= 0.3


def test_in_another_thread_no_handler_is_installed():
    seen = {}

    def loop() -> None:
        with StopSignals() as stop:
            seen["handler"] = signal.getsignal(signal.SIGTERM)
            stop.request("asked")
            seen["stopped"] = stop.wait(10)

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=loop)
    thread.start()
    thread.join(5)
    assert seen == {"handler": before, "stopped": True}


def test_cancelled_statements_are_recognised_through_the_errors_raised_from_them():
    canceled = psycopg.errors.QueryCanceled("canceling statement due to user request")
    assert cancelled(canceled)
    assert cancelled(DeliveryError("cannot apply update ...", sqlstate="57014"))
    try:
        try:
            raise canceled
        except psycopg.Error as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert cancelled(wrapped)
    assert not cancelled(psycopg.errors.AdminShutdown("terminating connection"))
    assert not cancelled(DeliveryError("row not found", sqlstate="RP598"))


def test_another_reason_to_stop_is_taken_as_a_signal_by_the_watchdog():
    gone = threading.Event()
    with StopSignals(cancel_after=0, also=lambda: "parent process gone" if gone.is_set() else None) as stop:
        assert stop.wait(0.3) is False
        gone.set()
        assert stop.wait(5) is True and stop.received == "parent process gone"
