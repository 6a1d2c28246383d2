"""A Spark standalone cluster for the tests: one master and two workers started from the
installed PySpark (``pyspark/bin/spark-class``, nothing downloaded), all on 127.0.0.1.

Each daemon runs in its own process group (the executors a worker launches, and their Python
workers, join the worker's group), so :meth:`StandaloneCluster.stop` leaves nothing behind.
Work directories, scratch space and daemon logs live under the given root.  The ``spark_cluster``
fixture of ``conftest.py`` starts one per session, only for the tests that ask for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

#: Generous: the machine has 2 cores shared with other work, and a JVM starts in seconds.
START_TIMEOUT = 120.0
STOP_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


class StandaloneCluster:
    """``StandaloneCluster(root).start()``: a master and ``workers`` workers (1 core and 1 GiB
    each); ``master_url`` is the ``spark://`` URL to submit to."""

    def __init__(self, root: Path, workers: int = 2) -> None:
        import pyspark

        self.root, self.n_workers = root, workers
        self.spark_home = Path(pyspark.__file__).resolve().parent
        self.port, self.webui_port = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def _env(self) -> dict[str, str]:
        conf_dir = self.root / "conf"  # empty: no spark-defaults or spark-env.sh of the machine
        conf_dir.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "PYSPARK_PYTHON": sys.executable,
        }

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.root / f"{name}.log").open("wb")
        cmd = [str(self.spark_home / "bin" / "spark-class"), *args]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env(), start_new_session=True)
        log.close()
        self.procs.append(proc)

    def start(self) -> StandaloneCluster:
        try:
            master = "org.apache.spark.deploy.master.Master"
            self._spawn(
                "master",
                [master, "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port)],
            )
            self._wait("the master", lambda state: state.get("status") == "ALIVE")
            self.master_url = self.master_state()["url"]  # Spark takes the next port when one is taken
            for i in range(1, self.n_workers + 1):
                self._start_worker(i)
            self._wait(f"{self.n_workers} workers", lambda state: state.get("aliveworkers") == self.n_workers)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_worker(self, i: int) -> None:
        work_dir = self.root / f"worker{i}"
        work_dir.mkdir(parents=True, exist_ok=True)
        args = ["--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--work-dir", str(work_dir)]
        ui = ["--webui-port", str(free_port())]
        self._spawn(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", self.master_url, *args, *ui])

    def master_state(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications)."""
        return _get_json(f"http://127.0.0.1:{self.webui_port}/json/")

    def _wait(self, what: str, ready: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited with code {proc.returncode}:\n{self.log_tails()}")
            try:
                if ready(self.master_state()):
                    return
            except OSError:
                pass  # the master's web UI is not up yet
            time.sleep(0.5)
        raise TimeoutError(
            f"{what} of the Spark standalone cluster not up in {START_TIMEOUT:.0f} s:\n{self.log_tails()}"
        )

    def executor_workers(self, app_id: str) -> dict[str, str]:
        """Executor id -> id of the worker that ran it, for the application ``app_id``."""
        found = {}
        for worker in self.master_state()["workers"]:
            state = _get_json(f"{worker['webuiaddress']}/json/")
            for executor in state.get("executors", []) + state.get("finishedexecutors", []):
                if executor.get("appid") == app_id:
                    found[str(executor["id"])] = state["id"]
        return found

    def log_tails(self, lines: int = 15) -> str:
        tails = []
        for log in sorted(self.root.glob("*.log")):
            tails.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(tails)

    def stop(self) -> None:
        """Stop the workers (with their executors), then the master: SIGTERM to each process
        group, SIGKILL to what is left after STOP_TIMEOUT."""
        for proc in reversed(self.procs):
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs.clear()

    def leftovers(self, pgids: list[int]) -> list[int]:
        """Processes (not zombies) still in the process groups ``pgids``."""
        alive = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if fields[0] != "Z" and int(fields[2]) in pgids:
                alive.append(int(stat.parent.name))
        return alive


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
