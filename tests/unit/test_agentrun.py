"""Pure logic of failure handling (no server): which errors are lost connections, errors
carried back from Spark tasks, one-line messages, result-file outcomes, redaction."""

from __future__ import annotations

import psycopg
import pytest

from airflow_repl.cli import report_error
from airflow_repl.engine.agents.distribution_agent import parse_until
from airflow_repl.engine.errors import (
    AgentBusy,
    ConnectionFailed,
    ConnectionLost,
    DeliveryError,
    DifferencesFound,
    NotInitialized,
    ReplError,
    SubscribersFailed,
    most_serious,
    redact,
)
from airflow_repl.engine.runtime import lifecycle
from airflow_repl.jobs.agent_job import AGENTS, error_lines, failure


@pytest.mark.parametrize(
    "exc, lost",
    [
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
        (psycopg.errors.CrashShutdown("terminating connection because of crash of another server process"), True),
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),  # no SQLSTATE
        (psycopg.InterfaceError("the connection is closed"), True),
        (psycopg.errors.LockNotAvailable("could not obtain lock"), False),
        (psycopg.errors.TooManyConnections("sorry, too many clients already"), False),
        (psycopg.errors.UniqueViolation("duplicate key"), False),
        (ValueError("x"), False),
    ],
)
def test_which_errors_are_lost_connections(exc, lost):
    assert lifecycle.is_connection_loss(exc) is lost


def test_the_last_engine_error_in_a_spark_traceback_is_the_one_raised():
    text = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        "psycopg.errors.AdminShutdown: terminating connection\n\nDuring handling of the above exception ...\n"
        "airflow_repl.engine.errors.ConnectionLost: lost connection to the subscriber 'sub1' (127.0.0.1:5) "
        "during delivery; the run is recorded as failed; run it again\n\tat org.apache.spark..."
    )
    err = lifecycle.engine_error_in(text)
    assert isinstance(err, ConnectionLost) and err.retryable
    assert str(err) == (
        "lost connection to the subscriber 'sub1' (127.0.0.1:5) during delivery; the run is "
        "recorded as failed; run it again"
    )
    assert lifecycle.engine_error_in("java.lang.OutOfMemoryError") is None
    assert lifecycle.engine_error_in("airflow_repl.engine.errors.NoSuchError: x") is None


def test_host_port_never_carries_the_password():
    assert lifecycle.host_port("host=db.example port=6543 user=u password=s3cret dbname=d") == "db.example:6543"
    assert lifecycle.host_port("dbname=d") == "localhost:5432"


def test_redact_hides_passwords_of_connection_strings_and_uris():
    assert redact("host=h password='a b' dbname=d") == "host=h password=*** dbname=d"
    assert redact("password=abc port=1") == "password=*** port=1"
    assert redact("see postgresql://u:s3cret@h:5/d now") == "see postgresql://u:***@h:5/d now"
    assert redact("no secret here: postgresql://u@h/d") == "no secret here: postgresql://u@h/d"


def test_a_multi_line_message_is_still_one_line(capsys):
    assert report_error(ReplError("cluster did not start: boom\nlog line 1\nlog line 2")) == 2
    err = capsys.readouterr().err
    assert err == "airflow-repl: error: cluster did not start: boom (2 more line(s) with -v)\n"
    assert report_error(psycopg.errors.AdminShutdown("terminating connection")) == 5
    assert "lost a connection to a server (terminating connection)" in capsys.readouterr().err


def test_the_traceback_of_an_internal_error_shows_only_with_verbose(capsys):
    try:
        {}["missing"]
    except KeyError as exc:
        assert report_error(exc, verbose=False) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "internal error (KeyError): 'missing'; this is a bug" in err
        assert report_error(exc, verbose=True) == 1
        assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize(
    "exc, code, retryable",
    [
        (NotInitialized("subscriber 'sub1' has no snapshot"), 3, False),
        (AgentBusy("another Log Reader Agent is running"), 5, True),
        (ReplError("bad"), 2, False),
        (psycopg.errors.AdminShutdown("terminating connection"), 5, True),
        (RuntimeError("boom"), 1, False),
    ],
)
def test_result_file_outcome_per_error_class(exc, code, retryable):
    outcome = failure(exc)
    assert outcome["status"] == "failed" and outcome["exit_code"] == code and outcome["retryable"] is retryable
    assert "\n" not in outcome["message"]


def test_until_is_checked_and_defaults_to_utc():
    assert parse_until("2026-11-23T13:00:00").utcoffset().total_seconds() == 0
    assert parse_until("2026-11-23T13:00:00+02:00").utcoffset().total_seconds() == 7200
    with pytest.raises(ReplError, match="--until 'yesterday' is not an ISO-8601 time"):
        parse_until("yesterday")


def test_the_agents_are_a_table():
    assert list(AGENTS) == ["snapshot", "logreader", "distribution", "queuereader", "validate"]


@pytest.mark.parametrize(
    "codes, most",
    [
        ([0, 0], 0),
        ([0, 5], 5),
        ([5, 4], 4),  # a delivery error is not fixed by a retry: the run is not retried
        ([6, 5], 5),  # a subscriber that could not be compared matters more than one that differs
        ([6, 3, 2], 2),
        ([5, 1, 4], 1),  # a bug always shows
    ],
)
def test_the_most_serious_exit_code_is_the_lowest_non_zero_one(codes, most):
    assert most_serious(codes) == most


def _failed(subscriber: str, exc: Exception) -> dict:
    return {"subscriber": subscriber, **failure(exc)}


def test_subscribers_failed_is_a_line_per_failure_with_the_most_serious_code(capsys):
    lost = _failed("s3", ConnectionFailed("cannot connect to the subscriber 's3' at u@h:1/d: refused"))
    exc = SubscribersFailed(
        {"subscriptions": []},
        [_failed("s2", DeliveryError("cannot apply update (command 1): relation missing.\nDETAIL: x")), lost],
    )
    assert (exc.exit_code, exc.retryable) == (4, False)
    assert str(exc).splitlines() == [
        "subscriber 's2': cannot apply update (command 1): relation missing.",
        "subscriber 's3': cannot connect to the subscriber 's3' at u@h:1/d: refused",
    ]
    assert report_error(exc) == 4
    assert capsys.readouterr().err.splitlines() == [
        "airflow-repl: error: subscriber 's2': cannot apply update (command 1): relation missing. (1 more line(s) with -v)",
        "airflow-repl: error: subscriber 's3': cannot connect to the subscriber 's3' at u@h:1/d: refused",
    ]
    only_retryable = SubscribersFailed({}, [lost, _failed("s4", AgentBusy("another agent"))])
    assert (only_retryable.exit_code, only_retryable.retryable) == (5, True)
    outcome = failure(exc)  # the result file: the outcome of each, and a line each for the job's stderr
    assert outcome["error_class"] == "SubscribersFailed" and outcome["exit_code"] == 4
    assert [f["subscriber"] for f in outcome["failures"]] == ["s2", "s3"] and outcome["summary"] == {
        "subscriptions": []
    }
    assert error_lines(outcome) == str(exc).splitlines()
    differs = SubscribersFailed({}, [_failed("s1", DifferencesFound("differ")), lost])
    assert differs.exit_code == 5


def test_an_internal_error_of_one_subscriber_shows_its_traceback_only_with_verbose(capsys):
    try:
        {}["missing"]
    except KeyError as bug:
        exc = SubscribersFailed({}, [_failed("s1", bug)])
    assert report_error(exc) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("airflow-repl: error: subscriber 's1': internal error (KeyError)")
    assert report_error(exc, verbose=True) == 1
    assert "Traceback" in capsys.readouterr().err


def test_the_cli_keeps_sparks_own_output_off_the_console_unless_verbose(tmp_path, capsys):
    from airflow_repl.cli import main
    from airflow_repl.jobs import session

    missing = str(tmp_path / "missing.yaml")
    try:
        assert main(["-v", "apply", "-t", missing]) == 2
        assert session._jvm_console == [True]
        assert main(["apply", "-t", missing]) == 2
        assert session._jvm_console == [False]  # a local session's JVM then writes nowhere
    finally:
        session.quiet_jvm_console(False)
    capsys.readouterr()
