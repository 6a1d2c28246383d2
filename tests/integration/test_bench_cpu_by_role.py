"""``make bench`` counts the CPU of the servers' processes by role (``CpuByRole`` of
``benchmarks/native_compare.py``) to show where a catch-up's time goes, for native replication and
for ours: here against a real cluster, with a backend that works, short connections that end
between two readings, and a cluster that is not running."""

from __future__ import annotations

import psycopg
import pytest

from airflow_repl.engine.errors import ReplError
from airflow_repl.sandbox import Sandbox


def test_cpu_of_a_clusters_processes_is_counted_by_role_and_in_full(bench, tmp_path):
    sandbox = Sandbox(tmp_path / "sb", clusters=("publisher",))
    try:
        conninfo = sandbox.start()["publisher"]
        sandbox.create_database("publisher", "cpu_role_db")
        busy = sandbox.conninfo("publisher", "cpu_role_db")
        with psycopg.connect(conninfo) as idle:  # a backend that lives through the step and does nothing
            cpu = bench.CpuByRole({"publisher": sandbox.server_pid("publisher")})
            with psycopg.connect(busy) as conn:
                conn.execute("SELECT sum(i) FROM generate_series(1, 20000000) AS i").fetchone()
            for _ in range(20):  # connections that end between two readings
                with psycopg.connect(conninfo) as short:
                    short.execute("SELECT 1").fetchone()
            roles = cpu.stop()["publisher"]
            idle.execute("SELECT 1")
        assert roles["backend cpu_role_db"] >= 0.3  # about a second of CPU here
        assert roles.get("backend postgres", 0.0) < 0.2  # the idle one, and the short ones as far as they were read
        # what the short connections used is counted all the same, as the postmaster's reaped children
        assert roles[bench.ENDED] > 0.0
        assert sum(roles.values()) >= roles["backend cpu_role_db"]
    finally:
        sandbox.destroy()


def test_the_server_pid_of_a_cluster_that_is_not_running_is_a_one_line_error(tmp_path):
    sandbox = Sandbox(tmp_path / "sb", clusters=("publisher",))
    with pytest.raises(ReplError, match=r"sandbox cluster 'publisher' is not running .*'airflow-repl sandbox start'"):
        sandbox.server_pid("publisher")
