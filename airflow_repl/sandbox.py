"""The embedded default: private PostgreSQL clusters that airflow-repl starts itself in a local
folder, configured for logical decoding and two-phase commit.

PostgreSQL refuses to run as root, so when we are root the clusters run as an unprivileged
system user (``airflowrepl``, created on first use).  The superuser password is random, kept in
``sandbox.json`` (mode 0600) and passed to ``initdb`` through a file, never on a command line.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg import sql

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.postgres import raw_sql
from airflow_repl.engine.postgres.lsn import int_to_lsn, lsn_to_int

if TYPE_CHECKING:
    from airflow_repl.sandbox_mariadb import MariaDBServer

RUN_AS = "airflowrepl"
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_prepared_transactions": "20",
    "max_replication_slots": "50",
    "max_wal_senders": "20",
    "max_connections": "100",
    "shared_buffers": "128MB",
    # A sandbox trades crash durability of the *server* for speed; agents' crash safety is
    # about agent processes and is unaffected.  synchronous_commit stays on: logical decoding
    # only sees flushed WAL, and tests expect a commit to be readable at once.
    "fsync": "off",
    "full_page_writes": "off",
}


#: WAL segment size of the clusters made by :meth:`Sandbox.add_wal_cluster` (``initdb --wal-segsize``),
#: small so that a test crosses any WAL position by writing about one segment.
WAL_SEGMENT_BYTES = 1 << 20
#: Smaller settings for those clusters (a test may run several of them beside the main two).
WAL_CLUSTER_SETTINGS = {"shared_buffers": "32MB", "max_connections": "50"}


def wal_file_name(lsn: str | int, *, timeline: int = 1, segment_bytes: int = WAL_SEGMENT_BYTES) -> str:
    """The name of the WAL segment file holding ``lsn`` (timeline, then the segment number split
    into its 4 GB "xlogid" and the segment within it, 8 hex digits each), the form
    ``pg_resetwal -l`` takes."""
    segno = (lsn_to_int(lsn) if isinstance(lsn, str) else lsn) // segment_bytes
    per_xlogid = 0x1_0000_0000 // segment_bytes
    return f"{timeline:08X}{segno // per_xlogid:08X}{segno % per_xlogid:08X}"


def find_bindir() -> Path:
    """Directory holding initdb/pg_ctl: $AIRFLOW_REPL_PG_BINDIR, the newest
    /usr/lib/postgresql/*/bin, or the one on PATH."""
    env = os.environ.get("AIRFLOW_REPL_PG_BINDIR")
    candidates = [env] if env else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True)
    which = shutil.which("initdb")
    if which:
        candidates.append(str(Path(which).resolve().parent))
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    raise ReplError(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found: install them "
        "(Debian: apt-get install postgresql) or set AIRFLOW_REPL_PG_BINDIR"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _insert_position(conn: psycopg.Connection) -> str:
    (lsn,) = raw_sql.one_row(conn.execute("SELECT pg_catalog.pg_current_wal_insert_lsn()::text"))
    return str(lsn)


def server_environment() -> dict[str, str]:
    """The environment the sandbox's server programs run with: this process's, without the
    ``PG*`` variables of a user's shell (``PGPASSWORD``, ``PGHOST``, ``PGSERVICE``, ...).  A
    server's own connections (a native subscription's walreceiver, say) read libpq's variables
    too, and ``PGPASSWORD`` would win over the passfile they are given."""
    return {name: value for name, value in os.environ.items() if not name.startswith("PG")}


class Sandbox:
    """A set of named PostgreSQL clusters under ``root``."""

    def __init__(self, root: str | Path, clusters: tuple[str, ...] = ("publisher", "subscriber")) -> None:
        self.root = Path(root).resolve()
        self.clusters = clusters
        self.state_file = self.root / "sandbox.json"
        self.bindir = find_bindir()
        self.as_root = os.geteuid() == 0

    # ------------------------------------------------------------------ helpers
    def _ensure_user(self) -> None:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", RUN_AS], check=True
            )

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", RUN_AS, "--", *cmd]
        return subprocess.run(cmd, cwd="/", check=check, capture_output=True, text=True, env=server_environment())

    def _chown(self, path: Path) -> None:
        if self.as_root:
            shutil.chown(path, RUN_AS, RUN_AS)

    def _state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text()) if self.state_file.exists() else {}

    def _save(self, state: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(state, indent=2))
        os.chmod(self.state_file, 0o600)

    def _pg_base(self) -> Path:
        """Where the clusters live: ``<root>/pg``, unless we are root and the unprivileged server
        user cannot reach that folder (a checkout under /root, say): then a private folder
        under /var/tmp, recorded in sandbox.json."""
        state = self._state()
        if state.get("pg_base"):
            return Path(state["pg_base"])
        base = self.root / "pg"
        if self.as_root and not self._reachable(self.root):
            digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:10]
            base = Path("/var/tmp") / f"airflow-repl-sandbox-{digest}"
        state["pg_base"] = str(base)
        self._save(state)
        return base

    def _reachable(self, path: Path) -> bool:
        return (
            subprocess.run(
                ["runuser", "-u", RUN_AS, "--", "test", "-x", str(path)], cwd="/", capture_output=True
            ).returncode
            == 0
        )

    def _datadir(self, name: str) -> Path:
        return self._pg_base() / name

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> dict[str, str]:
        """Create (first time) and start every cluster.  Returns cluster name -> conninfo of its
        ``postgres`` database."""
        if self.as_root:
            self._ensure_user()
        self.root.mkdir(parents=True, exist_ok=True)
        base = self._pg_base()
        state = self._state()
        state.setdefault("password", secrets.token_urlsafe(18))
        state.setdefault("ports", {})
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._chown(base)
        for name in self.clusters:
            datadir = self._datadir(name)
            if not (datadir / "PG_VERSION").exists():
                self._initdb(datadir, state["password"])
            port = state["ports"].get(name) or _free_port()
            state["ports"][name] = port
            self._configure(datadir, port)
            self._save(state)
            self._start_cluster(name)
        self._save(state)
        return {name: self.conninfo(name) for name in self.clusters}

    def _start_cluster(self, name: str) -> None:
        datadir = self._datadir(name)
        if self._run("pg_ctl", "-D", str(datadir), "status", check=False).returncode != 0:
            res = self._run(
                "pg_ctl", "-D", str(datadir), "-l", str(datadir / "server.log"), "-w", "-t", "60", "start", check=False
            )
            if res.returncode != 0:
                log_tail = (datadir / "server.log").read_text()[-2000:] if (datadir / "server.log").exists() else ""
                raise ReplError(f"sandbox cluster {name!r} did not start: {res.stderr.strip()}\n{log_tail}")

    def restart_cluster(self, name: str, mode: str = "fast") -> None:
        """Restart one cluster; ``mode`` is pg_ctl's ``-m``: ``fast``, or ``immediate``, which
        is a server crash (the cluster recovers from its WAL when it starts again)."""
        if mode not in ("smart", "fast", "immediate"):
            raise ReplError(f"restart mode {mode!r} is not one of smart, fast, immediate")
        datadir = self._datadir(name)
        res = self._run("pg_ctl", "-D", str(datadir), "-m", mode, "-w", "-t", "60", "stop", check=False)
        if res.returncode != 0:
            raise ReplError(f"sandbox cluster {name!r} did not stop: {res.stderr.strip()}")
        self._start_cluster(name)

    # ------------------------------------------------------------------ clusters at a chosen WAL position
    def add_wal_cluster(self, name: str, wal_start: str | int) -> str:
        """Create and start cluster ``name`` (replacing any cluster of that name) whose write-ahead
        log begins at the start of the 1 MB segment holding ``wal_start`` (an LSN such as
        ``'0/FC00000'``), so that tests reach LSN boundaries such as 0/10000000 or 10/0 by writing
        megabytes instead of gigabytes.  ``initdb --wal-segsize=1``, then ``pg_resetwal -l``
        before the first start.  Databases created in it (:meth:`create_database`) are copied
        with ``STRATEGY file_copy``, which writes almost no WAL.  Returns the conninfo of its
        ``postgres`` database; :meth:`stop` and :meth:`destroy` include it."""
        if name in self.clusters:
            raise ReplError(f"sandbox cluster {name!r} is one of the sandbox's own clusters; choose another name")
        if self.as_root:
            self._ensure_user()
        state = self._state()
        if "password" not in state:
            raise ReplError(f"no sandbox in {self.root}: start it before adding clusters")
        datadir = self._datadir(name)
        if (datadir / "PG_VERSION").exists():
            self._run("pg_ctl", "-D", str(datadir), "-m", "immediate", "-w", "stop", check=False)
        self._initdb(datadir, state["password"], f"--wal-segsize={WAL_SEGMENT_BYTES >> 20}")
        res = self._run("pg_resetwal", "-l", wal_file_name(wal_start), str(datadir), check=False)
        if res.returncode != 0:
            raise ReplError(f"pg_resetwal failed for {datadir}: {res.stderr.strip()}")
        state = self._state()
        port = state["ports"].get(name) or _free_port()
        state["ports"][name] = port
        state.setdefault("wal_clusters", {})[name] = int_to_lsn(
            lsn_to_int(wal_start) if isinstance(wal_start, str) else wal_start
        )
        self._save(state)
        self._configure(datadir, port, WAL_CLUSTER_SETTINGS)
        self._start_cluster(name)
        return self.conninfo(name)

    def wal_clusters(self) -> list[str]:
        """The clusters made by :meth:`add_wal_cluster`."""
        return list(self._state().get("wal_clusters", {}))

    def wal_position(self, cluster: str) -> str:
        """The cluster's current WAL insert position."""
        with psycopg.connect(self.conninfo(cluster), autocommit=True) as conn:
            return _insert_position(conn)

    def advance_wal(self, cluster: str, target: str | int) -> str:
        """Write WAL (segment switches, nothing else) until the cluster's insert position reaches
        ``target``; returns the new position.  A target at a segment start (every boundary where
        an LSN's text gains a digit is one) is reached exactly: the next record written goes
        just after it (past the segment's page header)."""
        goal = lsn_to_int(target) if isinstance(target, str) else target
        with psycopg.connect(self.conninfo(cluster), autocommit=True) as conn:
            while True:
                pos = _insert_position(conn)
                if lsn_to_int(pos) >= goal:
                    return pos
                # something to switch away from (a switch of an empty segment does nothing)
                conn.execute("SELECT pg_catalog.pg_logical_emit_message(false, 'airflow_repl_sandbox', '')")
                conn.execute("SELECT pg_catalog.pg_switch_wal()")

    def _initdb(self, datadir: Path, password: str, *extra: str) -> None:
        if datadir.exists():
            shutil.rmtree(datadir)
        pwfile = self._pg_base() / f".pw-{secrets.token_hex(4)}"
        pwfile.write_text(password + "\n")
        os.chmod(pwfile, 0o600)
        self._chown(pwfile)
        try:
            res = self._run(
                "initdb",
                "-D",
                str(datadir),
                "-U",
                "postgres",
                f"--pwfile={pwfile}",
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
                *extra,
                check=False,
            )
            if res.returncode != 0:
                raise ReplError(f"initdb failed for {datadir}: {res.stderr.strip()}")
        finally:
            pwfile.unlink(missing_ok=True)

    def _configure(self, datadir: Path, port: int, overrides: dict[str, str] | None = None) -> None:
        conf = datadir / "postgresql.auto.conf"
        lines = [f"port = {port}", f"unix_socket_directories = '{datadir}'"]
        lines += [f"{k} = {v}" for k, v in {**SETTINGS, **(overrides or {})}.items()]
        text = "# managed by airflow-repl sandbox\n" + "\n".join(lines) + "\n"
        if not conf.exists() or conf.read_text() != text:
            conf.write_text(text)
            self._chown(conf)

    def mariadb(self) -> MariaDBServer:
        """The sandbox's private MariaDB server (:mod:`airflow_repl.sandbox_mariadb`), started by
        its ``start()``; :meth:`stop` and :meth:`destroy` include it."""
        from airflow_repl.sandbox_mariadb import MariaDBServer

        return MariaDBServer(self)

    def stop(self) -> dict[str, str]:
        """Stop the sandbox's servers; what became of each (``stopped``, ``not running``)."""
        if not self.state_file.exists():
            return {}
        out = {}
        if "mariadb" in self._state():
            server = self.mariadb()
            out["mariadb"] = "stopped" if server.running() else "not running"
            server.stop()
        for name in [*self.clusters, *self.wal_clusters()]:
            datadir = self._datadir(name)
            if (datadir / "PG_VERSION").exists():
                done = self._run("pg_ctl", "-D", str(datadir), "-m", "fast", "-w", "stop", check=False)
                out[name] = "stopped" if done.returncode == 0 else "not running"
        return out

    def destroy(self) -> None:
        if not self.state_file.exists():
            return
        self.stop()
        shutil.rmtree(self._pg_base(), ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def status(self) -> dict[str, str]:
        if not self.state_file.exists():
            raise ReplError(f"no sandbox in {self.root}: start one with 'airflow-repl sandbox start'")
        out = {}
        for name in self.clusters:
            running = self._run("pg_ctl", "-D", str(self._datadir(name)), "status", check=False).returncode == 0
            out[name] = f"{'running' if running else 'stopped'} on 127.0.0.1:{self._state()['ports'][name]}"
        return out

    # ------------------------------------------------------------------ access
    def server_pid(self, cluster: str) -> int:
        """The process id of the cluster's postmaster (the first line of its ``postmaster.pid``),
        for tools that watch its processes (``make bench`` counts their CPU)."""
        pidfile = self._datadir(cluster) / "postmaster.pid"
        try:
            return int(pidfile.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            raise ReplError(
                f"sandbox cluster {cluster!r} is not running (no readable {pidfile}): start it with 'airflow-repl sandbox start'"
            ) from None

    def conninfo(self, cluster: str, dbname: str = "postgres") -> str:
        state = self._state()
        return pg_conninfo.make_conninfo(
            host="127.0.0.1", port=state["ports"][cluster], user="postgres", password=state["password"], dbname=dbname
        )

    def drop_database(self, cluster: str, dbname: str) -> None:
        """Drop a database and the replication slots that live in it."""
        with psycopg.connect(self.conninfo(cluster), autocommit=True) as conn:
            for (slot,) in conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (dbname,)
            ).fetchall():
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            gids = [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (dbname,))]
            if gids:  # prepared transactions can only be finished from their own database
                with psycopg.connect(self.conninfo(cluster, dbname), autocommit=True) as own:
                    for gid in gids:
                        own.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))

    def create_database(self, cluster: str, dbname: str, *, recreate: bool = False) -> str:
        if recreate:
            self.drop_database(cluster, dbname)
        # PostgreSQL 15 copies the template through the WAL (several MB) unless told otherwise:
        # a cluster placed just below a WAL position must not be pushed past it by that
        strategy = sql.SQL(" STRATEGY file_copy" if cluster in self.wal_clusters() else "")
        with psycopg.connect(self.conninfo(cluster), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}{}").format(sql.Identifier(dbname), strategy))
        return self.conninfo(cluster, dbname)
