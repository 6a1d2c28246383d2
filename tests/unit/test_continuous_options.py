"""Continuous mode's options, without a server: bad values and combinations are refused with one
line before anything runs (the running mode is tested in tests/integration/test_continuous.py)."""

from __future__ import annotations

import json
import time

import pytest

from airflow_repl import cli
from airflow_repl.engine.errors import USAGE_EXIT_CODE, ReplError
from airflow_repl.engine.runtime import continuous
from airflow_repl.jobs import agent_job

UNTIL = "2026-11-23T13:00:00+00:00"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("airflow-repl: error: ")
    return err


def test_continuous_and_until_are_refused_together_by_the_cli(capsys, tmp_path):
    missing = str(tmp_path / "never-read.yaml")  # refused before the topology is read
    code = cli.main(["distribution", "-t", missing, "--continuous", "--until", UNTIL])
    assert code == USAGE_EXIT_CODE
    assert "until (--until) and continuous (--continuous) cannot be combined" in _one_error_line(capsys)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--continuous", "--poll-interval", "-1"], "poll_interval (--poll-interval) -1.0 is not a positive number"),
        (["--continuous", "--poll-interval", "0"], "poll_interval (--poll-interval) 0.0 is not a positive number"),
        (["--continuous", "--max-run-seconds", "-5"], "max_run_seconds (--max-run-seconds) -5.0 is not a positive"),
        (["--poll-interval", "2"], "poll_interval apply to continuous runs only: add continuous (--continuous)"),
    ],
)
def test_bad_continuous_options_are_refused_by_the_cli(capsys, tmp_path, args, says):
    assert cli.main(["logreader", "-t", str(tmp_path / "never-read.yaml"), *args]) == USAGE_EXIT_CODE
    assert says in _one_error_line(capsys)


def test_the_log_reader_distribution_and_queue_reader_run_continuously_and_no_other(capsys, tmp_path):
    assert cli.main(["snapshot", "-t", str(tmp_path / "t.yaml"), "--continuous"]) == USAGE_EXIT_CODE
    assert "unrecognized arguments: --continuous" in _one_error_line(capsys)
    with pytest.raises(
        ReplError,
        match="the validate agent has no continuous mode: only logreader, distribution and queuereader run continuously",
    ):
        continuous.check_request("validate", None, {"continuous": True})
    continuous.check_request("queuereader", None, {"continuous": True, "poll_interval": 0.5})  # accepted
    args = ["queuereader", "-t", str(tmp_path / "never-read.yaml"), "--continuous", "--poll-interval", "-1"]
    assert cli.main(args) == USAGE_EXIT_CODE  # the option exists, and is checked like the others'
    assert "poll_interval (--poll-interval) -1.0 is not a positive number" in _one_error_line(capsys)


SPEC = {
    "publisher": "postgresql://h/pub",
    "distributor": "postgresql://h/dist",
    "subscribers": {"sub1": "postgresql://h/sub"},
    "publications": [{"name": "p", "articles": [{"table": "public.t"}]}],
    "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
}


def test_the_job_refuses_continuous_with_until_and_writes_the_failure(tmp_path, capsys):
    spec, result = tmp_path / "spec.json", tmp_path / "result.json"
    spec.write_text(json.dumps(SPEC))
    argv = ["distribution", "--spec", str(spec), "--result", str(result), "--publication", "p", "--continuous"]
    assert agent_job.main([*argv, "--until", UNTIL]) == ReplError.exit_code
    assert capsys.readouterr().err == ""  # with a result file the operator reports it, once
    outcome = json.loads(result.read_text())
    assert outcome["status"] == "failed" and outcome["error_class"] == "ReplError"
    assert "cannot be combined" in outcome["message"]
    spec.write_text(json.dumps(SPEC))
    without_result = [a for a in argv if a not in ("--result", str(result))]
    assert agent_job.main([*without_result, "--poll-interval", "-0.5"]) == ReplError.exit_code
    assert "poll_interval (--poll-interval) -0.5 is not a positive number" in _one_error_line(capsys)


def test_options_defaults_and_values():
    assert continuous.options(False) is None
    assert continuous.options(True) == continuous.Continuous(continuous.POLL_INTERVAL, continuous.MAX_RUN_SECONDS)
    assert continuous.options(True, 0.5, 600) == continuous.Continuous(0.5, 600.0)
    for bad in ("x", float("nan"), float("inf")):
        with pytest.raises(ReplError, match="is not a positive number of seconds"):
            continuous.options(True, bad)


def test_an_idle_continuous_loop_wakes_when_its_stream_brings_work():
    """A continuous run's idle sleep ends as soon as ``wake`` says work came (a replication
    stream), not after the whole poll interval; without work it sleeps the interval."""

    class Run:
        label, dist, run_id, step, loop = "Log Reader Agent", None, None, "", None

        def where(self) -> str:
            return "publication 'p'"

        def connections(self) -> list:
            return []

    calls: list[float] = []

    def wake(seconds: float) -> bool:
        calls.append(seconds)
        return len(calls) == 3

    loop = continuous.Loop(continuous.Continuous(poll_interval=30, max_run_seconds=60), Run(), {})
    started = time.monotonic()
    assert loop.idle(False, wake=wake)
    assert time.monotonic() - started < 5 and len(calls) == 3  # woken at the third look, not after 30 s
    assert all(0 < s <= continuous.SLICE for s in calls)  # waits in slices: SIGTERM ends it promptly
    quiet = continuous.Loop(continuous.Continuous(poll_interval=0.5, max_run_seconds=60), Run(), {})
    started = time.monotonic()
    assert quiet.idle(False, wake=lambda s: time.sleep(s) or False)
    assert time.monotonic() - started >= 0.5
