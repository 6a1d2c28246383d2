"""A local Spark session's driver JVM writes the class archive as its process ends, and the next
driver maps it (:mod:`airflow_repl.jobs.class_archive`): real JVMs, each in a process of its own,
both running a job, with nothing of the JVM's on stdout (where the CLI writes its JSON)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow_repl.jobs import class_archive

SCRIPT = """
import sys
from airflow_repl.jobs.session import spark_session
spark = spark_session("airflow-repl-class-archive-test", "local[1]")
print(spark.sparkContext.parallelize(range(4), 2).sum())
print("options:", spark.sparkContext.getConf().get("spark.driver.extraJavaOptions"), file=sys.stderr)
"""


def _session(cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, class_archive.ENV: str(cache)}
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)


def test_the_first_driver_writes_the_class_archive_and_the_next_one_maps_it(tmp_path):
    cache = tmp_path / "cache"
    first = _session(cache)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout == "6\n"
    assert "-XX:ArchiveClassesAtExit=" in first.stderr
    archives = list(cache.glob("spark-driver-*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10_000_000  # about 110 MB of classes
    assert not list(cache.glob("*.pending")) and not list(cache.glob("*.log"))

    second = _session(cache)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout == "6\n"
    assert f"-XX:SharedArchiveFile={archives[0]} -Xshare:auto" in second.stderr
    assert list(cache.iterdir()) == archives  # mapped, nothing written again
