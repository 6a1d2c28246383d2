"""The distribution schema's migrations: numbered in order, what a database at a version still
needs, the refusal of a newer one, and the recognition of a database made before versions were
recorded (its schema's digest comment, as the frozen copy of that DDL in ``data/`` computes it)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.state import dist_schema
from airflow_repl.engine.state.dist_schema import MIGRATIONS, Migration

#: The distribution DDL as airflow-repl ran it before versions were recorded, frozen, by the digest
#: it marked the schema with (the first, then with pause and drop).
DATA = Path(__file__).parent / "data"
FROZEN = {
    digest: (DATA / f"distribution_ddl_{digest}.sql").read_text() for digest in ("c65c0fe6d55c40f8", "2ec133100489f1fd")
}


def test_the_migrations_are_numbered_one_two_in_order():
    dist_schema.check_ordered(MIGRATIONS)
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))


@pytest.mark.parametrize(
    "versions",
    [(2, 1), (1, 3), (1, 2, 2), (0, 1), (2,)],
    ids=["swapped", "gap", "repeated", "zero", "not from one"],
)
def test_migrations_out_of_order_are_a_bug(versions):
    migrations = tuple(Migration(v, f"m{v}", "SELECT 1") for v in versions)
    with pytest.raises(ValueError, match=r"not numbered 1, 2, \.\.\. in order"):
        dist_schema.check_ordered(migrations)
    with pytest.raises(ValueError):
        dist_schema.pending(0, migrations, "dist")


def test_a_database_needs_the_migrations_after_its_version_in_order():
    latest = len(MIGRATIONS)
    assert dist_schema.pending(0, MIGRATIONS, "dist") == MIGRATIONS
    assert [m.version for m in dist_schema.pending(3, MIGRATIONS, "dist")] == list(range(4, latest + 1))
    assert dist_schema.pending(latest, MIGRATIONS, "dist") == ()


def test_a_newer_database_is_refused_in_one_line_naming_it():
    latest = len(MIGRATIONS)
    with pytest.raises(TopologyError) as refused:
        dist_schema.pending(latest + 1, MIGRATIONS, "dist\nx")
    message = str(refused.value)
    assert "\n" not in message
    assert f"schema version {latest + 1}, newer than this airflow-repl knows (up to {latest})" in message
    assert "'dist\\nx'" in message and "release that upgraded it" in message


def test_the_migrations_are_the_ddl_each_digest_marked_schema_ran():
    """A fresh database is made as airflow-repl made it before versions were recorded, and a
    database it marked is recognised (its comment: the digest of that DDL) at the version whose
    migrations that DDL was."""
    first, second = FROZEN["c65c0fe6d55c40f8"], FROZEN["2ec133100489f1fd"]
    assert "".join(m.sql for m in MIGRATIONS[:8]) == first
    paused, drops = MIGRATIONS[8].sql, MIGRATIONS[9].sql
    assert first.replace("-- tracer tokens", paused + "-- tracer tokens", 1) + drops == second
    for digest, ddl in FROZEN.items():
        assert hashlib.sha256(ddl.encode()).hexdigest()[:16] == digest
    assert dist_schema.DIGEST_MARKS == {
        "airflow-repl distribution schema c65c0fe6d55c40f8": 8,
        "airflow-repl distribution schema 2ec133100489f1fd": 10,
    }


def test_a_database_made_before_versions_were_recorded_is_at_the_version_its_mark_names():
    for mark, version in dist_schema.DIGEST_MARKS.items():
        assert dist_schema.version_before_records(mark) == version
        assert dist_schema.pending(version, MIGRATIONS, "dist")[0].version == version + 1
    assert dist_schema.version_before_records("airflow-repl distribution schema 0123456789abcdef") == 0
    assert dist_schema.version_before_records(None) == 0
