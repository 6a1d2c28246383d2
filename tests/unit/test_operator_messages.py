"""What the operator reads, without a server: an internal error is one line unless verbose, and
the validation report names the keys that differ."""

from __future__ import annotations

from airflow_repl.cli import report_error
from airflow_repl.engine.subscriber import validation


def test_the_traceback_of_an_internal_error_shows_only_with_verbose(capsys, monkeypatch):
    try:
        {}["missing"]
    except KeyError as exc:
        assert report_error(exc, verbose=False) == 1
        _out, err = capsys.readouterr()
        assert err.count("\n") == 1 and "internal error (KeyError): 'missing'; this is a bug" in err
        assert "Traceback" not in err
        assert report_error(exc, verbose=True) == 1
        assert "Traceback" in capsys.readouterr().err


def test_report_lists_the_keys_that_differ():
    report = [
        {
            "article": "a",
            "publisher_rows": 2,
            "subscriber_rows": 1,
            "publisher_checksum": "x" * 32,
            "subscriber_checksum": "y" * 32,
            "match": False,
            "differences": [{"key": "(1)", "difference": "missing at the subscriber"}],
        }
    ]
    lines = validation.format_report(report).splitlines()
    assert lines[1].endswith("NO") and lines[2] == "    key (1): missing at the subscriber"
