"""A batch's prepared transactions over several streams: their names (a MariaDB XA identifier
within its 64-byte parts for any publication name) and what recovery decides of them, the one
rule both engines follow."""

from __future__ import annotations

import re

import pytest

from airflow_repl.engine.subscriber import mariadb_streams, two_phase


def test_a_gid_reads_back_whatever_its_tag_holds():
    name = two_phase.gid("p|with|bars", "b1", "0/16B3748", 2, 3)
    assert name.startswith(two_phase.gid_prefix("p|with|bars"))
    assert two_phase.parse(name) == two_phase.Prepared(name, "b1", "0/16B3748", 2, 3)


def members(batch, last, streams, total):
    return [two_phase.parse(two_phase.gid("p", batch, last, s, total)) for s in streams]


@pytest.mark.parametrize(
    ("streams", "watermark", "commit"),
    [
        ([0, 1, 2], None, True),  # prepared on every stream
        ([0, 1, 2], "0/5000", True),
        ([1, 2], "0/5000", False),  # stream 0 never prepared: the prepare phase was cut short
        ([1], "0/6000", True),  # stream 0 committed (the watermark reached the batch)
        ([2], "0/7000", True),
        ([0, 1], "0/5FFF", False),
    ],
)
def test_recovery_commits_a_batch_prepared_everywhere_or_already_committed_on_stream_0(streams, watermark, commit):
    [(decided, ordered)] = two_phase.recovery(members("b", "0/6000", streams, 3), watermark)
    assert decided is commit
    assert [m.stream for m in ordered] == sorted(streams, reverse=True)  # stream 0 (the watermark) last


def test_recovery_decides_each_batch_on_its_own():
    found = members("x", "0/5000", [1, 2], 3) + members("z", "0/6000", [0, 1, 2], 3) + members("y", "0/6000", [0, 1], 3)
    decided = {ordered[0].batch: commit for commit, ordered in two_phase.recovery(found, "0/4000")}
    assert decided == {"x": False, "z": True, "y": False}


@pytest.mark.parametrize(
    "publication", ["p", "a" * 63, "pub 'quoted' \n line `go` -- /* ä \U0001f600", "é" * 120, "p|q"]
)
@pytest.mark.parametrize("database", ["d", "db_with_a_long_name_" * 3 + "abc", "db `x` 'y'\n -- /* ä \U0001f600"])
def test_a_mariadb_xa_identifier_fits_its_64_byte_parts_for_any_publication(publication, database):
    tag = mariadb_streams.tag(database, publication)
    assert tag == mariadb_streams.tag(database, publication)  # stable
    assert tag != mariadb_streams.tag(database + "2", publication)  # one server, two databases: never the same
    gid = two_phase.gid(tag, "0123456789ab", "FFFFFFFF/FFFFFFFF", 63, 64)
    match = re.fullmatch(r"X'([0-9a-f]+)', X'([0-9a-f]+)', 1", mariadb_streams.xid(gid))
    assert match is not None
    gtrid, bqual = (bytes.fromhex(part) for part in match.groups())
    assert len(gtrid) <= 64 and len(bqual) <= 64
    assert f"{gtrid.decode()}|{bqual.decode()}" == gid
