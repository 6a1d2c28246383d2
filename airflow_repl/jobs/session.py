"""The SparkSession an agent runs in, and starting one in the background while the agent does
the work that needs no Spark (a local JVM takes seconds to start)."""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys
import threading
from typing import Any

from airflow_repl.jobs import class_archive

#: The master of a session started outside spark-submit (CLI, tests), unless one is given.
DEFAULT_MASTER = "local[2]"
#: The driver JVM's heap of such a session ($AIRFLOW_REPL_SPARK_DRIVER_MEMORY): the agents' data
#: goes through the Python workers and the servers, never through the driver's heap, so Spark's
#: default of 1g only makes the process tree bigger.
DEFAULT_DRIVER_MEMORY = "512m"
#: How long the end of a process that started a local session waits for its JVM to exit when the
#: JVM writes the class archive (it does once; about 2 s for 110 MB here).
ARCHIVE_WAIT_SECONDS = 60


#: Whether the JVM of a local session started by this process writes its console output (Spark's
#: log4j lines, its progress bar, the Python workers' stderr) to the console (the CLI's -v) or
#: nowhere (the CLI otherwise: the agents' own lines and errors say what happened).
_jvm_console = [True]


def quiet_jvm_console(quiet: bool = True) -> None:
    """Keep (or stop keeping) the console of local sessions started later free of Spark's own
    output; the CLI calls it unless -v."""
    _jvm_console[0] = not quiet


def default_master() -> str:
    """$AIRFLOW_REPL_SPARK_MASTER, else ``local[2]``."""
    return os.environ.get("AIRFLOW_REPL_SPARK_MASTER", DEFAULT_MASTER)


def in_process() -> bool:
    """Whether the Snapshot Agent's tasks run in threads of this process (jobs.local_tasks): outside
    spark-submit, when $AIRFLOW_REPL_SPARK_MASTER names no master."""
    return not under_spark_submit() and not os.environ.get("AIRFLOW_REPL_SPARK_MASTER")


def under_spark_submit() -> bool:
    """Whether this process is a spark-submit application's driver (its session exists)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ  # set by spark-submit's PythonRunner


def spark_session(app_name: str, master: str | None = None):
    """The SparkSession of the running spark-submit application, or else a local one
    (CLI, tests) on ``master`` / $AIRFLOW_REPL_SPARK_MASTER / ``local[2]``.

    Python workers use this interpreter unless PYSPARK_PYTHON says otherwise, so executors
    import the same installed airflow_repl.  A local session's driver JVM starts from the class
    archive, or writes it as this process ends (:mod:`~airflow_repl.jobs.class_archive`).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    options = {"spark.app.name": app_name, "spark.sql.shuffle.partitions": "4"}
    archive = None
    if not under_spark_submit():
        options |= {
            "spark.master": master or default_master(),
            "spark.ui.enabled": "false",
            "spark.driver.memory": os.environ.get("AIRFLOW_REPL_SPARK_DRIVER_MEMORY", DEFAULT_DRIVER_MEMORY),
            "spark.ui.showConsoleProgress": "false",  # the agents log their own progress
        }
        archive = class_archive.plan()  # the driver JVM starts from the class archive, or writes it
        if archive is not None:
            options["spark.driver.extraJavaOptions"] = archive.options
        if not _jvm_console[0]:
            _launch_quiet_jvm(options)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    started = builder.getOrCreate()
    if archive is not None and archive.pending is not None:
        atexit.register(_keep_archive, archive)
    return started


def _launch_quiet_jvm(options: dict[str, str]) -> None:
    """Start the JVM a local session's SparkContext then uses (as PySpark would, with the same
    settings) with its standard output and error going nowhere: Spark's log4j lines, its
    progress bar, the Python workers' stderr and any Java stack stay off the console."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:  # already started (and kept for the process's life)
        return
    conf = SparkConf(loadDefaults=False).setAll(list(options.items()))
    gateway = launch_gateway(conf, popen_kwargs={"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL})
    SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm


def _keep_archive(archive: class_archive.Plan) -> None:
    """As the process ends: stop the local session's JVM and wait for it to exit (it writes the
    class archive as it does), then keep the archive (:mod:`~airflow_repl.jobs.class_archive`)."""
    from pyspark import SparkContext

    active = SparkContext._active_spark_context
    if active is not None:
        try:
            active.stop()
        except Exception:  # a context that cannot stop cleanly: its JVM exits all the same
            pass
    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:
        return
    try:
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway JVM exits at the end of its stdin
        proc.wait(timeout=ARCHIVE_WAIT_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return  # left pending: a later run removes it
    archive.keep()


def local_parallelism(master: str) -> int | None:
    """The default parallelism of a local master (``local``: 1, ``local[N]`` and
    ``local[N,F]``: N, ``local[*]``: the machine's cores); None for a cluster's master."""
    if master == "local":
        return 1
    found = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master)
    if found is None:
        return None
    return (os.cpu_count() or 1) if found.group(1) == "*" else max(1, int(found.group(1)))


class StartingSession:
    """A SparkSession starting in a background thread (:func:`spark_session`); using any of its
    attributes waits for it, and a failure to start is raised there.  The thread is a daemon:
    a run that fails before it needs Spark does not wait for the JVM to exit."""

    def __init__(self, app_name: str, master: str | None = None) -> None:
        self._done = threading.Event()
        self._session: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._start, args=(app_name, master), name="spark-session-start", daemon=True
        )
        self._thread.start()

    def _start(self, app_name: str, master: str | None) -> None:
        try:
            self._session = spark_session(app_name, master)
        except BaseException as exc:  # raised where the session is used
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> Any:
        """The started SparkSession (waits for it)."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.result(), name)
