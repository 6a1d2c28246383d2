"""The sandbox's private MariaDB server: its own user, address, password and crash recovery."""

from __future__ import annotations

import os
import pwd
import stat

from airflow_repl.sandbox import RUN_AS


def test_private_server_runs_unprivileged_on_loopback_with_a_secret_password(sandbox, mariadb):
    server = mariadb.server
    pid = server.pid()
    assert pid is not None
    owner = os.stat(f"/proc/{pid}").st_uid
    if os.geteuid() == 0:
        assert owner == pwd.getpwnam(RUN_AS).pw_uid
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().decode()
    assert server.password not in cmdline
    assert "--no-defaults" in cmdline and "--bind-address=127.0.0.1" in cmdline
    assert stat.S_IMODE(os.stat(sandbox.state_file).st_mode) == 0o600
    assert server.password in sandbox.state_file.read_text()
    assert not list(server.datadir.parent.glob(".mariadb-setup-*")), "the setup file with the password is left"
    [(charset, user)] = mariadb.rows("mysql", "SELECT @@character_set_server, CURRENT_USER()")
    assert (charset, user) == ("utf8mb4", "root@127.0.0.1")


def test_wrong_password_is_refused(mariadb):
    import pymysql
    import pytest

    args = {**mariadb.server.connect_args(), "password": "wrong"}
    with pytest.raises(pymysql.err.OperationalError) as err:
        pymysql.connect(**args)
    assert err.value.args[0] == 1045


def test_committed_rows_survive_a_crash_of_the_server(mariadb):
    db = mariadb.new_database("crash")
    mariadb.run(db, "CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB")
    mariadb.run(db, "INSERT INTO t VALUES (1), (2)")
    old = mariadb.server.pid()
    mariadb.restart(kill=True)
    assert mariadb.server.pid() not in (None, old)
    assert mariadb.rows(db, "SELECT id FROM t ORDER BY id") == [(1,), (2,)]
