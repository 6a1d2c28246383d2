"""LSNs are numbers: positions compare and sort as pg_lsn / integers, never as text.

The publisher runs in a cluster whose WAL starts just below a position where an LSN's text
gains a digit (0/FFFFFFF -> 0/10000000, 1/FFFFFFF -> 1/10000000, F/FFFFFFFF -> 10/0): there,
text order puts later transactions first.
"""

from __future__ import annotations

import pytest

from airflow_repl.engine.pgoutput import int_to_lsn, lsn_to_int
from airflow_repl.engine.sandbox import wal_file_name
from conftest import WAL_BOUNDARIES


# ---------------------------------------------------------------------- no server
def test_wal_file_name_of_1mb_segments():
    assert wal_file_name("0/10000000") == "000000010000000000000100"
    assert wal_file_name("1/10000000") == "000000010000000100000100"
    assert wal_file_name("F/FFC00000") == "000000010000000F00000FFC"
    assert wal_file_name("10/0", timeline=2) == "000000020000001000000000"
    assert wal_file_name(0x1_0FFF_FFFF) == "0000000100000001000000FF"  # the segment below 1/10000000


# ---------------------------------------------------------------------- the sandbox's WAL clusters
@pytest.mark.parametrize("boundary", WAL_BOUNDARIES)
def test_wal_env_starts_below_its_boundary_and_crosses_it(wal_env, boundary):
    env = wal_env(boundary)
    env.run(env.pub, "CREATE TABLE t (id int PRIMARY KEY)")
    start = lsn_to_int(env.wal_position())
    assert lsn_to_int(boundary) - (4 << 20) <= start < lsn_to_int(boundary) - (1 << 20)
    env.cross_boundary()
    env.run(env.pub, "INSERT INTO t VALUES (2)")
    after = lsn_to_int(env.wal_position())
    assert lsn_to_int(boundary) < after < lsn_to_int(boundary) + 4096
    assert int_to_lsn(lsn_to_int(boundary)) == boundary.upper()
