"""How a command's result reaches standard output: JSON, or the validation's text report."""

from __future__ import annotations

import json
from typing import Any

from airflow_repl.engine.subscriber import validation


def print_validation(result: dict[str, Any], output: str) -> None:
    """``validate``'s report: JSON, or a text report per subscriber validated."""
    if output == "json":
        print_result(result)
        return
    print(
        "\n\n".join(f"subscriber {s}:\n{validation.format_report(rows)}" for s, rows in result["subscribers"].items()),
        flush=True,
    )


def print_result(result: Any) -> None:
    """A command's result, if any, as JSON on standard output."""
    if result is not None:
        print(json.dumps(result, indent=2, default=str), flush=True)
