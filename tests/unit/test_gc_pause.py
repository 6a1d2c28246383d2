"""The collector pause of a batch: nested and overlapping pauses resume the collector once, and
only when it was running before."""

from __future__ import annotations

import gc
import threading

import pytest

from airflow_repl.engine.runtime import gc_pause


@pytest.fixture(autouse=True)
def _collector_restored():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_a_pause_stops_the_collector_and_resumes_it_even_after_an_error():
    gc.enable()
    with pytest.raises(RuntimeError), gc_pause.paused():
        assert not gc.isenabled()
        raise RuntimeError("a failed batch")
    assert gc.isenabled()


def test_nested_and_overlapping_pauses_resume_once_at_the_last_end():
    gc.enable()
    first_in, second_done, first_done = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with gc_pause.paused():
            first_in.set()
            second_done.wait(10)
            seen.append(gc.isenabled())  # the other thread's pause ended: still paused here
        first_done.set()

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(10)
    with gc_pause.paused(), gc_pause.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the first thread's pause goes on
    second_done.set()
    first_done.wait(10)
    thread.join(10)
    assert seen == [False] and gc.isenabled()


def test_a_collector_the_caller_had_disabled_stays_disabled():
    gc.disable()
    with gc_pause.paused():
        pass
    assert not gc.isenabled()
