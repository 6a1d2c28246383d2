"""The Log Reader Agent's compiled hot path: a pgoutput row message of a published relation
straight to the COPY line that stores its command, and a transaction's commit straight to the
COPY line that stores the transaction and its position's pg_lsn text (``_command_lines.c``).

It writes exactly what the Python path writes (``pgoutput.decode``, ``change_mapping.row_commands``,
``Command.to_json``, ``dist_transactions.command_line``) for the common messages: an INSERT, a DELETE, and an
UPDATE that stays an UPDATE, of text values.  It declines (None) everything else, which then
takes the Python path: pairs, unchanged TOASTed values it cannot fill in, binary values, bytes
that are not UTF-8, malformed messages.  A transaction's line is :func:`dist_transactions.transaction_line`'s, for
a commit time as a replication message carries it (the Python path writes a commit time outside
years 1000 to 9999).  The module is built when the package is installed with
a C compiler at hand; without it, or with ``AIRFLOW_REPL_PURE_PYTHON=1`` in the environment,
the Log Reader takes the Python path for every message.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Sequence

from airflow_repl.engine.postgres import lsn

#: ``row_line(message, positions, keys, pairs, prefix, command_id, article)``: the line, or None.
RowLine = Callable[[bytes | memoryview, bytes, bytes, bool, bytes, int, bytes], bytes | None]

#: ``transaction_line(publication, xact_seqno, xid, commit_us, end_lsn, command_count, article_rows,
#: origin, schema_change)``: :func:`dist_transactions.transaction_line`'s line, or None.
TransactionLine = Callable[[bytes, str, int, int, int, int, dict[str, int], str | None, bool], bytes | None]

_compiled: RowLine | None
_transaction_line: TransactionLine | None
_lsn_text: Callable[[int], str] | None
try:
    from airflow_repl.engine.agents._command_lines import lsn_text as _lsn_text
    from airflow_repl.engine.agents._command_lines import row_line as _compiled
    from airflow_repl.engine.agents._command_lines import transaction_line as _transaction_line
except ImportError:  # built without a C compiler: the Python path alone
    _compiled = _transaction_line = _lsn_text = None

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


def transaction_line() -> TransactionLine | None:
    """The compiled transaction line, or None (as :func:`row_line`)."""
    return None if row_line() is None else _transaction_line


def lsn_text() -> Callable[[int], str]:
    """The pg_lsn text of a WAL position: compiled, else :func:`lsn.int_to_lsn` (as :func:`row_line`)."""
    return lsn.int_to_lsn if row_line() is None or _lsn_text is None else _lsn_text


def uint16s(values: Sequence[int]) -> bytes:
    """Column positions as the compiled function takes them (a relation has at most 1,664
    columns)."""
    return array("H", values).tobytes()
