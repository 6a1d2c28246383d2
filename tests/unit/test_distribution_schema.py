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

#: The distribution DDL as the last release without recorded versions ran it, frozen.
FROZEN_DDL = (Path(__file__).parent / "data" / "distribution_ddl_before_versions.sql").read_text()


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


def test_the_first_eight_migrations_are_the_ddl_the_digest_marked_release_ran():
    """A fresh database is made as the last release without versions made it, and a database
    that release marked is recognised (its comment: the digest of that DDL)."""
    assert "".join(m.sql for m in MIGRATIONS[: dist_schema.DIGEST_MARK_VERSION]) == FROZEN_DDL
    digest = hashlib.sha256(FROZEN_DDL.encode()).hexdigest()[:16]
    assert f"airflow-repl distribution schema {digest}" == dist_schema.DIGEST_MARK


def test_a_database_made_before_versions_were_recorded_is_at_the_version_its_mark_names():
    assert dist_schema.version_before_records(dist_schema.DIGEST_MARK) == dist_schema.DIGEST_MARK_VERSION
    assert dist_schema.version_before_records("airflow-repl distribution schema 0123456789abcdef") == 0
    assert dist_schema.version_before_records(None) == 0
    assert dist_schema.pending(dist_schema.DIGEST_MARK_VERSION, MIGRATIONS, "dist")[0].version == 9
