"""Runs one ``airflow-repl`` command in its own process and kills it with SIGKILL at a chosen
step boundary: just before its K-th call into a database (a statement, a COPY, a transaction
block, a commit or a rollback, on any psycopg connection of any thread), so that a test stops a
run at a seeded random one of every point where it talks to a server, and a failure replays from
its seed.

usage: python kill_runner.py K <airflow-repl arguments...>

K = 0 runs the command to its end; either way the last line on standard error is
``boundaries: N`` (the calls it made) unless the process was killed.
"""

import os
import signal
import sys
import threading

import psycopg

_count = 0
_lock = threading.Lock()
_kill_at = int(sys.argv[1])


def _boundary() -> None:
    global _count
    with _lock:
        _count += 1
        if _count == _kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def _counted(cls: type, name: str) -> None:
    original = getattr(cls, name)

    def call(self, *args, **kwargs):
        _boundary()
        return original(self, *args, **kwargs)

    setattr(cls, name, call)


for _cls, _names in (
    (psycopg.Cursor, ("execute", "executemany", "copy", "stream")),
    (psycopg.Connection, ("commit", "rollback", "transaction")),
):
    for _name in _names:
        _counted(_cls, _name)


def main() -> int:
    from airflow_repl.cli import main as cli_main

    try:
        return cli_main(sys.argv[2:])
    finally:
        print(f"boundaries: {_count}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
