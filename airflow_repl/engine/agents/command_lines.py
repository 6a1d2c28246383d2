"""The Log Reader Agent's compiled hot path: a pgoutput row message of a published relation
straight to the COPY line that stores its command (``_command_lines.c``).

It writes exactly what the Python path writes (``pgoutput.decode``, ``change_mapping.row_commands``,
``Command.to_json``, ``dist_transactions.command_line``) for the common messages: an INSERT, a DELETE, and an
UPDATE that stays an UPDATE, of text values.  It declines (None) everything else, which then
takes the Python path: pairs, unchanged TOASTed values it cannot fill in, binary values, bytes
that are not UTF-8, malformed messages.  The module is built when the package is installed with
a C compiler at hand; without it, or with ``AIRFLOW_REPL_PURE_PYTHON=1`` in the environment,
the Log Reader takes the Python path for every message.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Sequence

#: ``row_line(message, positions, keys, pairs, prefix, command_id, article)``: the line, or None.
RowLine = Callable[[bytes | memoryview, bytes, bytes, bool, bytes, int, bytes], bytes | None]

_compiled: RowLine | None
try:
    from airflow_repl.engine.agents._command_lines import row_line as _compiled
except ImportError:  # built without a C compiler: the Python path alone
    _compiled = None

#: Set (to anything but empty or 0) to run the Log Reader on the Python path alone.
PURE_PYTHON_ENV = "AIRFLOW_REPL_PURE_PYTHON"


def compiled() -> bool:
    """Is the compiled module built (whether or not the environment turns it off)?"""
    return _compiled is not None


def row_line() -> RowLine | None:
    """The compiled function, or None when it is not built or the environment turns it off."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    return _compiled


def uint16s(values: Sequence[int]) -> bytes:
    """Column positions as the compiled function takes them (a relation has at most 1,664
    columns)."""
    return array("H", values).tobytes()
