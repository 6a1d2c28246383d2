"""A private MariaDB server beside the sandbox's PostgreSQL clusters: the subscriber engine of
``docs/subscribers-mariadb.md`` for the demo and the tests.

Like the clusters it has its own data directory (``<pg base>/mariadb``), runs as the
sandbox's unprivileged user when we are root, listens on a free port of 127.0.0.1 and its
``root`` account (reachable from 127.0.0.1 only) has a random password kept in the sandbox's
``sandbox.json`` (mode 0600).  The password reaches the server through a SQL file of mode 0600
read once by ``mariadb-install-db``, never through a command line.  ``mariadb-install-db`` and
``mariadbd`` run with ``--no-defaults`` (no ``/etc/mysql`` option file applies) and a
``--tmpdir`` of their own: the system temporary folder is not writable by their user.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow_repl.engine.errors import ReplError

if TYPE_CHECKING:
    import pymysql

    from airflow_repl.sandbox import Sandbox

#: server settings (``mariadbd`` options); text is utf8mb4 always, and the server's default
#: collation stays MariaDB's case-insensitive one, the trap airflow-repl handles on purpose
SETTINGS = {
    "bind-address": "127.0.0.1",
    "skip-name-resolve": None,
    "character-set-server": "utf8mb4",
    "collation-server": "utf8mb4_general_ci",
    "default-storage-engine": "InnoDB",
    "local-infile": "1",
    "max-connections": "100",
    "innodb-buffer-pool-size": "64M",
    "innodb-log-file-size": "48M",
    # a sandbox trades durability against a crash of the *machine* for speed: a commit is
    # written to the log at once (it survives a kill -9 of mariadbd) and flushed each second
    "innodb-flush-log-at-trx-commit": "2",
    "performance-schema": "OFF",
    "skip-log-bin": None,
}
USER = "root"
NAME = "mariadb"


def find_mariadbd() -> tuple[Path, Path]:
    """``mariadbd`` and ``mariadb-install-db``: $AIRFLOW_REPL_MARIADB_BINDIR, /usr/sbin and
    /usr/bin, or PATH."""
    env = os.environ.get("AIRFLOW_REPL_MARIADB_BINDIR")
    dirs = [Path(env)] if env else []
    dirs += [Path("/usr/sbin"), Path("/usr/bin")]
    server = next((d / "mariadbd" for d in dirs if (d / "mariadbd").exists()), None)
    install = next((d / "mariadb-install-db" for d in dirs if (d / "mariadb-install-db").exists()), None)
    server = server or (Path(p) if (p := shutil.which("mariadbd")) else None)
    install = install or (Path(p) if (p := shutil.which("mariadb-install-db")) else None)
    if server is None or install is None:
        raise ReplError(
            "MariaDB server binaries (mariadbd, mariadb-install-db) were not found: install them "
            "(Debian: apt-get install mariadb-server) or set AIRFLOW_REPL_MARIADB_BINDIR"
        )
    return server, install


def _sql_literal(text: str) -> str:
    """A MariaDB string literal of ``text`` (backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def _sql_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class MariaDBServer:
    """The sandbox's private MariaDB server (see the module's docstring)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    # ------------------------------------------------------------------ places
    @property
    def datadir(self) -> Path:
        return self.sandbox._pg_base() / NAME

    @property
    def _tmpdir(self) -> Path:
        return self.sandbox._pg_base() / f"{NAME}-tmp"

    @property
    def socket(self) -> Path:
        return self.datadir / "mariadbd.sock"

    @property
    def _pidfile(self) -> Path:
        return self.datadir / "mariadbd.pid"

    @property
    def log(self) -> Path:
        return self.datadir / "server.log"

    @property
    def port(self) -> int:
        port: int = self.sandbox._state()["mariadb"]["port"]
        return port

    @property
    def password(self) -> str:
        password: str = self.sandbox._state()["password"]
        return password

    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", self._run_as(), "--", *args] if self.sandbox.as_root else list(args)

    def _run_as(self) -> str:
        from airflow_repl.sandbox import RUN_AS

        return RUN_AS

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Create (first time) and start the server; returns the URI of its ``mysql`` database.
        The sandbox's PostgreSQL clusters must have been started (they hold the password)."""
        state = self.sandbox._state()
        if "password" not in state:
            raise ReplError(f"no sandbox in {self.sandbox.root}: start it before its MariaDB server")
        server, install = find_mariadbd()
        from airflow_repl.sandbox import _free_port

        mstate = state.setdefault("mariadb", {})
        mstate.setdefault("port", _free_port())
        self.sandbox._save(state)
        for folder in (self.datadir.parent, self._tmpdir):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.sandbox._chown(folder)
        if not (self.datadir / "mysql").is_dir():
            self._install(install)
        if not self.running():
            self._start(server)
        return self.uri("mysql")

    def _install(self, install: Path) -> None:
        if self.datadir.exists():
            shutil.rmtree(self.datadir)
        self.datadir.mkdir(mode=0o700)
        self.sandbox._chown(self.datadir)
        setup = self.sandbox._pg_base() / f".mariadb-setup-{os.getpid()}.sql"
        pw = _sql_literal(self.password)
        setup.write_text(
            "FLUSH PRIVILEGES;\n"  # bootstrap runs without the grant tables: load them
            f"CREATE USER {_sql_literal(USER)}@'127.0.0.1' IDENTIFIED BY {pw};\n"
            f"GRANT ALL PRIVILEGES ON *.* TO {_sql_literal(USER)}@'127.0.0.1' WITH GRANT OPTION;\n"
        )
        os.chmod(setup, 0o600)
        self.sandbox._chown(setup)
        try:
            res = subprocess.run(
                self._cmd(
                    str(install),
                    "--no-defaults",
                    f"--datadir={self.datadir}",
                    f"--tmpdir={self._tmpdir}",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                    "--skip-name-resolve",
                    f"--extra-file={setup}",
                ),
                cwd="/",
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            setup.unlink(missing_ok=True)
        if res.returncode != 0:
            shutil.rmtree(self.datadir, ignore_errors=True)
            raise ReplError(
                f"mariadb-install-db failed for {self.datadir}: {(res.stderr or res.stdout).strip()[-2000:]}"
            )

    def _start(self, server: Path) -> None:
        options = [f"--{k}={v}" if v is not None else f"--{k}" for k, v in SETTINGS.items()]
        cmd = self._cmd(
            str(server),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--tmpdir={self._tmpdir}",
            f"--port={self.port}",
            f"--socket={self.socket}",
            f"--pid-file={self._pidfile}",
            f"--log-error={self.log}",
            *options,
        )
        subprocess.Popen(
            cmd,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._pidfile.exists() and self._answers():
                return
            time.sleep(0.1)
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        raise ReplError(f"sandbox MariaDB server did not start within 60 s\n{tail}")

    def _answers(self) -> bool:
        import pymysql

        try:
            self.connect().close()
        except pymysql.MySQLError:
            return False
        return True

    def pid(self) -> int | None:
        """The server's process id, while it runs."""
        try:
            pid = int(self._pidfile.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid

    def running(self) -> bool:
        return self.pid() is not None and self._answers()

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: a clean shutdown (SIGTERM), or ``kill=True``: SIGKILL, a crash (InnoDB
        recovers from its redo log at the next start)."""
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.05)
        else:
            raise ReplError(f"sandbox MariaDB server (pid {pid}) did not stop within 60 s")
        if kill:
            self._pidfile.unlink(missing_ok=True)

    def restart(self, *, kill: bool = False) -> None:
        """Stop (``kill=True``: a crash) and start the server again on the same port."""
        self.stop(kill=kill)
        server, _ = find_mariadbd()
        self._start(server)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.datadir, ignore_errors=True)
        shutil.rmtree(self._tmpdir, ignore_errors=True)

    # ------------------------------------------------------------------ access
    def uri(self, database: str) -> str:
        """``mariadb://root:<password>@127.0.0.1:<port>/<database>`` (each part percent-encoded)."""
        return f"mariadb://{USER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{quote(database, safe='')}"

    def connect_args(self, database: str | None = None) -> dict[str, Any]:
        """PyMySQL's keyword arguments for a connection to ``database``."""
        args: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "user": USER,
            "password": self.password,
            "charset": "utf8mb4",
            "autocommit": True,
        }
        if database is not None:
            args["database"] = database
        return args

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:
        import pymysql

        return pymysql.connect(**self.connect_args(database))

    @contextmanager
    def connection(self, database: str | None = None) -> Iterator[pymysql.connections.Connection]:
        conn = self.connect(database)
        try:
            yield conn
        finally:
            conn.close()

    def create_database(self, database: str, *, recreate: bool = False) -> str:
        """Create ``database`` (utf8mb4; dropped first with ``recreate``); returns its URI."""
        with self.connection() as conn, conn.cursor() as cur:
            if recreate:
                cur.execute(f"DROP DATABASE IF EXISTS {_sql_identifier(database)}")
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {_sql_identifier(database)} CHARACTER SET utf8mb4")
        return self.uri(database)

    def drop_database(self, database: str) -> None:
        with self.connection() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {_sql_identifier(database)}")
