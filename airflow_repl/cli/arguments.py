"""The command line's argument types and shared words: the program's name, ISO-8601 times,
positive numbers, validation ranges; each a one-line usage error when wrong."""

from __future__ import annotations

import argparse
import math
from typing import Any

from airflow_repl.engine.subscriber import validation

PROG = "airflow-repl"


ISO_EXAMPLE = "2026-11-23T13:00:00+00:00"


def iso_time(value: str) -> str:
    """An ``--until`` / ``--since`` value: checked to be ISO-8601 (kept as given)."""
    from datetime import datetime

    try:
        datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO-8601 time: use e.g. {ISO_EXAMPLE} (a time without offset is UTC)"
        ) from None
    return value


def number(kind: type[int] | type[float], minimum: float, inclusive: bool) -> Any:
    """An argparse ``type`` accepting numbers of ``kind`` above ``minimum`` (or equal, if ``inclusive``)."""
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"

    def check(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number < minimum or (number == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"{value!r} is not {'an integer' if kind is int else 'a number'} {bound}")
        return number

    return check


POSITIVE_INT = number(int, 0, inclusive=False)


POSITIVE_FLOAT = number(float, 0, inclusive=False)


NON_NEGATIVE_FLOAT = number(float, 0, inclusive=True)


def validation_ranges(value: str) -> int:
    """A ``validate --ranges`` value: an integer from 1 to the engine's maximum."""
    number = POSITIVE_INT(value)
    if number > validation.MAX_RANGES:
        raise argparse.ArgumentTypeError(f"{value!r} is above the maximum of {validation.MAX_RANGES} ranges")
    return int(number)
