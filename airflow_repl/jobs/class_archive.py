"""A class-data archive of the Spark driver JVM (Java's application class-data sharing, AppCDS),
so that a Spark application's driver starts in about half the time: the JVM maps the 10,000 or
so classes Spark loads at start from one file, instead of reading and verifying them from the
jars every time (a local session on a 2-core machine: 7 to 9 s to 4.4 to 6.4 s).

The first driver JVM started without an archive writes one as it exits
(``-XX:ArchiveClassesAtExit``) to a file of its own, and logs when the archive is written whole.
Whoever waits for that JVM's exit (the CLI's local session as the process ends, an operator
once its spark-submit has returned) then moves the file into place (:meth:`Plan.keep`), with one
atomic rename and only if the log says the archive was written whole: a JVM that maps a
truncated archive crashes (SIGBUS), so it never sees one.  Later drivers map the archive
(``-XX:SharedArchiveFile``, ``-Xshare:auto``: a JVM whose class path does not match it goes on
without it).  The archive is named after the Java, the PySpark version and the Spark jars it was
made with (30 to 110 MB: the classes the first driver loaded; delete it to have the next driver
write it again).

Where: ``$AIRFLOW_REPL_SPARK_CLASS_ARCHIVE`` (a folder), else ``~/.cache/airflow-repl``; ``off``
turns it off.  With an archive the JVM's own logging is off except errors, which go to stderr:
the archive's warnings would otherwise go to stdout, where the CLI writes its JSON.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

#: A folder for the archive, or ``off``.
ENV = "AIRFLOW_REPL_SPARK_CLASS_ARCHIVE"
#: The JVM's logging with an archive: nothing but errors, to stderr.
QUIET = "-Xlog:disable -Xlog:all=error:stderr"
#: What the JVM logs once the archive it writes at exit is complete.
WRITTEN = "Written dynamic archive"
#: A pending archive (and its log) older than this was left by a JVM that did not end normally.
STALE_SECONDS = 3600


@dataclass(frozen=True)
class Plan:
    """The driver JVM's options (``spark.driver.extraJavaOptions``) and, when it is to write the
    archive, the file it writes at exit and the log that says when that is done."""

    options: str
    archive: Path
    pending: Path | None = None
    log: Path | None = None

    def keep(self) -> bool:
        """After the JVM exited: move the archive it wrote into place, when its log says it was
        written whole; True when it did.  Its leftovers are removed either way."""
        if self.pending is None or self.log is None:
            return False
        try:
            whole = self.pending.is_file() and WRITTEN in self.log.read_text(errors="replace")
            if whole:
                os.replace(self.pending, self.archive)
            return whole
        except OSError:
            return False
        finally:
            for leftover in (self.pending, self.log):
                leftover.unlink(missing_ok=True)


def folder() -> Path | None:
    """Where the archive lives (None: off)."""
    given = os.environ.get(ENV, "").strip()
    if given.lower() == "off":
        return None
    return Path(given).expanduser() if given else Path.home() / ".cache" / "airflow-repl"


def plan(where: Path | None = None) -> Plan | None:
    """The options of a driver JVM about to start: map the archive if there is one, else write
    one at exit.  None when it is turned off, or cannot be (no Java found, a folder that cannot
    be made, or whose path Spark would split: it splits the options at spaces)."""
    where = where or folder()
    name = archive_name()
    if where is None or name is None or re.search(r"[\s\"'\\]", str(where)):
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
        _remove_stale(where)
    except OSError:
        return None
    archive = where / name
    if archive.is_file():
        return Plan(f"-XX:SharedArchiveFile={archive} -Xshare:auto {QUIET}", archive)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    pending, log = where / f"{name}.{token}.pending", where / f"{name}.{token}.log"
    options = f"-XX:ArchiveClassesAtExit={pending} {QUIET} -Xlog:cds+dynamic=info:file={log}"
    return Plan(options, archive, pending, log)


def archive_name() -> str | None:
    """``spark-driver-<PySpark version>-<digest>.jsa``: the digest of the Java executable (its
    real path and size) and the names of Spark's jars; None when no Java or Spark is found."""
    java = _java()
    jars = _spark_jars()
    if java is None or jars is None:
        return None
    try:
        version = metadata.version("pyspark")
        facts = [str(java), str(java.stat().st_size), *sorted(p.name for p in jars.glob("*.jar"))]
    except (OSError, metadata.PackageNotFoundError):
        return None
    digest = hashlib.sha1("\n".join(facts).encode()).hexdigest()[:12]
    return f"spark-driver-{version}-{digest}.jsa"


def _java() -> Path | None:
    """The java that Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.exists(found) else None


def _spark_jars() -> Path | None:
    """Spark's jars: ``$SPARK_HOME/jars``, else those PySpark ships (found without importing it)."""
    home = os.environ.get("SPARK_HOME")
    if home:
        jars = Path(home) / "jars"
    else:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or not spec.submodule_search_locations:
            return None
        jars = Path(next(iter(spec.submodule_search_locations))) / "jars"
    return jars if jars.is_dir() else None


def _remove_stale(where: Path) -> None:
    """Pending archives and logs left by JVMs that did not end normally (killed, say)."""
    now = time.time()
    for path in [*where.glob("spark-driver-*.pending"), *where.glob("spark-driver-*.log")]:
        try:
            if now - path.stat().st_mtime > STALE_SECONDS:
                path.unlink()
        except OSError:
            pass
