"""The Spark driver's class archive (:mod:`airflow_repl.jobs.class_archive`): where it goes, the
JVM options that map or write it, and keeping only an archive whose writing JVM logged it whole
(a truncated one crashes the next JVM that maps it)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from airflow_repl.jobs import class_archive


@pytest.fixture
def java_and_spark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Java home and a Spark home of their own (the archive is named after them)."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_bytes(b"#!/bin/sh\n")
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    for name in ("spark-core_2.13-4.2.0.jar", "py4j-0.10.9.9.jar"):
        (jars / name).write_bytes(b"jar")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.delenv(class_archive.ENV, raising=False)
    return tmp_path


def test_without_an_archive_the_jvm_writes_one_to_a_file_of_its_own_and_logs_it(java_and_spark):
    where = java_and_spark / "cache"
    plan = class_archive.plan(where)
    assert plan is not None and plan.pending is not None and plan.log is not None
    assert plan.archive.parent == where and plan.archive.name.startswith("spark-driver-")
    assert plan.archive.name.endswith(".jsa") and not plan.archive.exists()
    assert plan.pending.parent == where and plan.pending != plan.archive
    assert f"-XX:ArchiveClassesAtExit={plan.pending}" in plan.options
    assert f"-Xlog:cds+dynamic=info:file={plan.log}" in plan.options
    assert class_archive.QUIET in plan.options  # nothing of the JVM's on stdout, where the CLI writes its JSON
    other = class_archive.plan(where)
    assert other is not None and other.pending != plan.pending  # two JVMs at once never write one file


def test_an_archive_logged_whole_is_kept_and_then_mapped(java_and_spark):
    where = java_and_spark / "cache"
    plan = class_archive.plan(where)
    assert plan is not None and plan.pending is not None and plan.log is not None
    plan.pending.write_bytes(b"archive" * 1000)
    plan.log.write_text(f"[21.8s][info][cds,dynamic] {class_archive.WRITTEN} 0x800 - 0x807 [984 bytes header]\n")
    assert plan.keep() is True
    assert plan.archive.read_bytes() == b"archive" * 1000
    assert not plan.pending.exists() and not plan.log.exists()
    again = class_archive.plan(where)
    assert again is not None and again.pending is None
    assert again.options == f"-XX:SharedArchiveFile={plan.archive} -Xshare:auto {class_archive.QUIET}"
    assert again.keep() is False  # nothing to keep for a JVM that only maps it


@pytest.mark.parametrize("log", [None, "[9.1s][info][cds,dynamic] Archiving hidden java.lang.invoke.LambdaForm\n"])
def test_an_archive_not_logged_whole_is_dropped(java_and_spark, log):
    """A JVM killed while it wrote the archive left part of it: keeping that would make every
    later driver crash as it maps it (SIGBUS)."""
    where = java_and_spark / "cache"
    plan = class_archive.plan(where)
    assert plan is not None and plan.pending is not None and plan.log is not None
    plan.pending.write_bytes(b"half an archive")
    if log is not None:
        plan.log.write_text(log)
    assert plan.keep() is False
    assert not plan.archive.exists() and not plan.pending.exists() and not plan.log.exists()


def test_leftovers_of_jvms_that_did_not_end_normally_are_removed_when_old(java_and_spark):
    where = java_and_spark / "cache"
    where.mkdir()
    old = where / "spark-driver-4.2.0-abc.jsa.1-ab.pending"
    old_log = where / "spark-driver-4.2.0-abc.jsa.1-ab.log"
    fresh = where / "spark-driver-4.2.0-abc.jsa.2-cd.pending"  # a JVM writing it now
    for path in (old, old_log, fresh):
        path.write_bytes(b"x")
    hours_ago = time.time() - class_archive.STALE_SECONDS - 60
    os.utime(old, (hours_ago, hours_ago))
    os.utime(old_log, (hours_ago, hours_ago))
    assert class_archive.plan(where) is not None
    assert not old.exists() and not old_log.exists() and fresh.exists()


def test_the_archive_is_named_after_the_java_and_the_spark_jars(java_and_spark):
    first = class_archive.archive_name()
    assert first is not None and first.startswith("spark-driver-")
    (java_and_spark / "spark" / "jars" / "extra-1.0.jar").write_bytes(b"jar")
    second = class_archive.archive_name()
    assert second is not None and second != first  # other jars: another class path, another archive
    (java_and_spark / "jdk" / "bin" / "java").write_bytes(b"#!/bin/sh\n# another build\n")
    assert class_archive.archive_name() not in (first, second)


def test_no_archive_when_turned_off_without_java_or_where_spark_would_split_the_path(
    java_and_spark, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(class_archive.ENV, "off")
    assert class_archive.folder() is None and class_archive.plan() is None
    monkeypatch.setenv(class_archive.ENV, str(java_and_spark / "with space"))
    assert class_archive.plan() is None  # Spark splits the driver's Java options at spaces
    monkeypatch.setenv(class_archive.ENV, str(java_and_spark / "cache"))
    assert class_archive.folder() == java_and_spark / "cache" and class_archive.plan() is not None
    monkeypatch.setenv("JAVA_HOME", str(java_and_spark / "no-jdk"))
    assert class_archive.plan() is None
    monkeypatch.delenv(class_archive.ENV)
    assert class_archive.folder() == Path.home() / ".cache" / "airflow-repl"


def test_a_folder_that_cannot_be_made_means_no_archive(java_and_spark):
    blocker = java_and_spark / "a-file"
    blocker.write_text("not a folder")
    assert class_archive.plan(blocker / "cache") is None
