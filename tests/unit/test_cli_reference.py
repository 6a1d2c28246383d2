"""docs/cli.md is the parser's own reference: a command or option added, renamed or re-explained
without regenerating it (python scripts/cli_reference.py) fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from airflow_repl import cli

ROOT = Path(__file__).resolve().parents[2]


def _reference_module():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_generated_from_the_current_parser():
    reference = _reference_module()
    assert (ROOT / "docs" / "cli.md").read_text() == reference.render(), (
        "docs/cli.md is out of date: run python scripts/cli_reference.py"
    )


def test_every_command_and_option_has_a_section_and_an_explanation():
    text = (ROOT / "docs" / "cli.md").read_text()
    parser = cli.build_parser()
    commands = _reference_module()._subcommands(parser)
    assert len(commands) >= 19
    for name, help_line, sub in commands:
        assert f"\n### {name}\n" in text, name
        assert help_line, f"command {name} has no help line"
        for action in sub._actions:
            if action.dest == "help":
                continue
            for option in action.option_strings:
                assert f"`{option}`" in text, f"{name} {option}"
            assert action.help, f"{name} {action.dest} has no help"
