"""The command line's parser, without a server: --version, plain-text help with every option
explained, option values checked by argparse, and the exit codes (docs/errors.md)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import airflow_repl
from airflow_repl import cli
from airflow_repl.engine.errors import (
    INTERNAL_EXIT_CODE,
    USAGE_EXIT_CODE,
    AgentBusy,
    DeliveryError,
    DifferencesFound,
    NotInitialized,
    ReplError,
)

ROOT = Path(__file__).resolve().parents[2]


def _parsers() -> list[argparse.ArgumentParser]:
    top = cli.build_parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return [top, *subs.choices.values()]


def test_version_prints_the_package_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"airflow-repl {airflow_repl.__version__}"


def test_every_option_of_every_command_has_help():
    missing = [
        f"{p.prog} {a.dest}"
        for p in _parsers()
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction) and not a.help
    ]
    assert missing == []


@pytest.mark.parametrize("parser", _parsers(), ids=lambda p: p.prog)
def test_help_is_plain_text(parser):
    text = parser.format_help()
    assert "``" not in text and not re.search(r":(mod|func|class|data|meth):", text), text


def test_the_help_explains_connections_and_exit_codes():
    text = cli.build_parser().format_help()
    assert "AIRFLOW_CONN_<ID>" in text and "postgresql://" in text
    for code, meaning in [(64, "usage error"), (6, "validate found differences"), (2, "replication or topology")]:
        assert re.search(rf"^  {code}\s+{meaning}", text, re.M), (code, text)


def _usage_error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("airflow-repl: error: "), err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("option", ["--until", "--since"])
def test_a_bad_time_is_a_usage_error_naming_the_format(capsys, tmp_path, option):
    command = "distribution" if option == "--until" else "conflicts"
    err = _usage_error(capsys, [command, "-t", str(tmp_path / "never-read.yaml"), option, "tomorrow"])
    assert f"argument {option}: 'tomorrow' is not an ISO-8601 time: use e.g. 2026-11-23T13:00:00+00:00" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["cleanup", "--batch-commands", "0"], "argument --batch-commands: '0' is not an integer > 0"),
        (["cleanup", "--min-retention", "-1"], "argument --min-retention: '-1' is not a number >= 0"),
        (["cleanup", "--max-retention", "nan"], "argument --max-retention: 'nan' is not a number > 0"),
        (["wal-retention", "--max-wal-mb", "x"], "argument --max-wal-mb: 'x' is not an integer > 0"),
        (["resolve-in-doubt", "--follow", "--interval", "-1"], "argument --interval: '-1' is not a number > 0"),
        (["tracer", "history", "--token", "-3"], "argument --token: '-3' is not an integer > 0"),
        (["apply", "--bogus"], "unrecognized arguments: --bogus"),
        (["status", "-o", "prometheus", "--check"], "status -o prometheus takes no --check: it writes the metrics"),
        (["status", "-o", "prometheus", "--max-pending", "5"], "status -o prometheus takes no --max-pending"),
    ],
)
def test_bad_numbers_and_options_are_usage_errors(capsys, tmp_path, argv, says):
    command, *rest = argv
    assert says in _usage_error(capsys, [command, "-t", str(tmp_path / "never-read.yaml"), *rest])


#: The output formats a command may offer; ``-o`` is always one of them, never a file.
FORMATS = {"table", "json", "html", "prometheus"}


def _output_options() -> dict[str, argparse.Action]:
    return {
        p.prog.split()[-1]: a
        for p in _parsers()[1:]
        for a in p._actions
        if "-o" in a.option_strings or "--output" in a.option_strings
    }


def test_dash_o_is_the_output_format_on_every_command_that_has_it():
    found = _output_options()
    assert {"status", "validate", "tracer", "plan", "report", "conflicts"} <= set(found), sorted(found)
    for command, action in found.items():
        assert action.option_strings == ["--output", "-o"] and action.dest == "output", command
        assert action.choices and set(action.choices) <= FORMATS, (command, action.choices)
        assert action.default in action.choices, command


@pytest.mark.parametrize("command", sorted(_output_options()))
def test_dash_o_refuses_a_file_name(capsys, tmp_path, command):
    argv = [command, *(["history"] if command == "tracer" else []), "-t", str(tmp_path / "never-read.yaml")]
    err = _usage_error(capsys, [*argv, "-o", "report.html"])
    assert "argument --output/-o" in err and "'report.html'" in err, err


def test_report_takes_its_file_from_file_and_says_so_when_given_one_after_o(capsys, tmp_path):
    args = cli.build_parser().parse_args(["report", "-t", "x", "-o", "json", "--file", "r.json"])
    assert (args.output, args.file) == ("json", "r.json")
    assert cli.build_parser().parse_args(["report", "-t", "x"]).output == "html"
    err = _usage_error(capsys, ["report", "-t", "x", "-o", "page.html"])
    assert "-o is html or json; write the report to a file with --file page.html" in err


def test_good_values_parse():
    args = cli.build_parser().parse_args(["cleanup", "-t", "x", "--min-retention", "0", "--batch-commands", "5"])
    assert args.min_retention == 0.0 and args.batch_commands == 5
    args = cli.build_parser().parse_args(["distribution", "-t", "x", "--until", "2026-11-23T13:00:00"])
    assert args.until == "2026-11-23T13:00:00"


def test_exit_codes_are_distinct_and_documented():
    codes = {
        "internal": INTERNAL_EXIT_CODE,
        "replication": ReplError.exit_code,
        "not initialized": NotInitialized.exit_code,
        "delivery": DeliveryError.exit_code,
        "retryable": AgentBusy.exit_code,
        "differences": DifferencesFound.exit_code,
        "usage": USAGE_EXIT_CODE,
    }
    assert len(set(codes.values())) == len(codes), codes
    table = (ROOT / "docs" / "errors.md").read_text()
    for code in codes.values():
        assert re.search(rf"^\| {code} \|", table, re.M), code
    assert DifferencesFound.retryable is False and issubclass(DifferencesFound, ReplError)


def test_provider_info_has_no_path_of_the_build_machine_for_a_url():
    """No public documentation site: no ``external-doc-url`` rather than a ``file://`` path."""
    (integration,) = airflow_repl.get_provider_info()["integrations"]
    assert "external-doc-url" not in integration
    assert (ROOT / "airflow_repl" / "py.typed").is_file()


def test_sandbox_env_without_a_sandbox_says_how_to_make_one(capsys, tmp_path):
    assert cli.main(["sandbox", "env", "--root", str(tmp_path / "none")]) == ReplError.exit_code
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"no sandbox in {tmp_path / 'none'}: start one with 'airflow-repl sandbox init-demo'" in err


def test_output_closed_by_its_reader_ends_quietly_with_sigpipes_code():
    """``airflow-repl ... | head``: the reader gone, the command ends with 141 (as a shell reports
    SIGPIPE) and nothing on standard error, not a BrokenPipeError traceback (a command's result
    stands in for a long one, e.g. ``status -o json`` of many subscriptions)."""
    import os
    import subprocess
    import sys

    program = (
        "import sys, airflow_repl.cli as cli\n"
        "def result(argv):\n"
        "    for i in range(100000):\n"
        "        print('row', i)\n"
        "    return 0\n"
        "cli._main = result\n"
        "sys.exit(cli.main([]))\n"
    )
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        done = subprocess.run([sys.executable, "-c", program], stdout=write, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, ""), (done.returncode, done.stderr)
