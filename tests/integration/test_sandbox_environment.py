"""The sandbox's servers run without the ``PG*`` variables of the shell that started them: a
user with ``PGPASSWORD`` exported (common among PostgreSQL users) ran ``make bench``, and the
native subscription's walreceiver took that password over its passfile and failed to log in."""

from __future__ import annotations

from pathlib import Path

import psycopg

from airflow_repl.sandbox import Sandbox


def _environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.decode().split("=", 1) for entry in raw.split(b"\0") if b"=" in entry)


def test_a_cluster_started_from_a_shell_with_pg_variables_runs_without_them(tmp_path, monkeypatch):
    for name, value in {"PGPASSWORD": "not-the-sandboxes", "PGAPPNAME": "shell", "PGSSLMODE": "require"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AIRFLOW_REPL_MARK", "kept")
    sandbox = Sandbox(tmp_path / "sb", clusters=("publisher",))
    try:
        conninfo = sandbox.start()["publisher"]
        with psycopg.connect(conninfo, sslmode="disable") as conn:
            datadir = conn.execute("SHOW data_directory").fetchone()[0]
        postmaster = int((Path(datadir) / "postmaster.pid").read_text().split()[0])
        environment = _environment(postmaster)
        assert not {"PGPASSWORD", "PGAPPNAME", "PGSSLMODE"} & set(environment)  # pg_ctl sets PGDATA and its own
        assert environment.get("AIRFLOW_REPL_MARK") == "kept"  # the rest of the environment is kept
    finally:
        sandbox.destroy()


def test_sandbox_stop_says_what_it_stopped(tmp_path, capsys):
    """``sandbox stop`` names each server and what became of it (it printed nothing), and a
    folder without a sandbox is one line."""
    from airflow_repl import cli

    sandbox = Sandbox(tmp_path / "sb", clusters=("publisher",))
    try:
        sandbox.start()
        capsys.readouterr()
        assert cli.main(["sandbox", "stop", "--root", str(sandbox.root)]) == 0
        assert "publisher" in (out := capsys.readouterr().out) and "stopped" in out and "not running" not in out, out
        assert cli.main(["sandbox", "stop", "--root", str(sandbox.root)]) == 0
        assert "not running" in capsys.readouterr().out
    finally:
        sandbox.destroy()
    assert cli.main(["sandbox", "stop", "--root", str(tmp_path / "none")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("airflow-repl: error: no sandbox in ") and "nothing to stop" in err[0], (
        err
    )
