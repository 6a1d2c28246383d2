"""Writes docs/cli.md, the command-line reference, from the ``airflow-repl`` argument parser.

Run ``python scripts/cli_reference.py`` after changing a command or an option;
``tests/unit/test_cli_reference.py`` fails while docs/cli.md and the parser disagree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from airflow_repl import cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"

INTRO = """\
# Command-line reference

`airflow-repl` is installed with the package (`pip install airflow-repl`, or `make install` in a
checkout). This page is generated from the command's own parser by `scripts/cli_reference.py`,
so it lists every command and option the installed version has; a unit test fails when the two
disagree. `airflow-repl --help` and `airflow-repl <command> --help` print the same text.

Connection references in the topology (`-t`) are resolved as [connections.md](connections.md)
says; exit codes and every error message are in [errors.md](errors.md). An option means the same
on every command that has it: `-t` the topology file, `-p` the publication, `-o/--output` the
output format (`table`, `json`, or for `report` `html`), never a file (`report --file` names one).
"""


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help line, parser) of each command, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
        if action.choices is not None and not isinstance(action.choices, dict):
            names += " (" + " \\| ".join(str(c) for c in action.choices) + ")"
        text = (action.help or "").replace("|", "\\|").replace("%%", "%")
        if action.required and action.option_strings:
            text = f"required; {text}"
        rows.append(f"| {names} | {text} |")
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def render() -> str:
    """The whole of docs/cli.md."""
    parser = cli.build_parser()
    out = [INTRO, "## Global options\n", "```text", _usage(parser), "```\n", "| Option | Meaning |", "|---|---|"]
    out += _option_rows(parser)
    out += ["", "## Commands\n", "| Command | Does |", "|---|---|"]
    commands = _subcommands(parser)
    out += [f"| [`{name}`](#{name}) | {text} |" for name, text, _ in commands]
    for name, text, sub in commands:
        out += ["", f"### {name}\n", f"{text[:1].upper()}{text[1:]}.\n", "```text", _usage(sub), "```"]
        rows = _option_rows(sub)
        if rows:
            out += ["", "| Argument | Meaning |", "|---|---|", *rows]
    out += ["", "## Exit codes and connection lookup\n", "```text", (parser.epilog or "").strip(), "```", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        return 0 if DOC.read_text() == text else 1
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
