"""WAL positions without a server: pg_lsn text parsed to numbers and back, and WAL file names.
(Crossing the positions where an LSN's text gains a digit, on real servers, is in
``tests/integration/test_lsn_boundaries.py``.)"""

from __future__ import annotations

import pytest

from airflow_repl.engine.postgres.lsn import int_to_lsn, lsn_to_int
from airflow_repl.sandbox import wal_file_name


def test_positions_parse_and_sort_as_numbers():
    text_order = sorted(["0/FFFFFFF", "0/10000000", "1/FFFFFFF", "1/10000000", "F/FFFFFFFF", "10/0", "2/0", "0/0"])
    assert text_order[:4] == ["0/0", "0/10000000", "0/FFFFFFF", "1/10000000"]  # what text order does
    assert sorted(text_order, key=lsn_to_int) == [
        "0/0",
        "0/FFFFFFF",
        "0/10000000",
        "1/FFFFFFF",
        "1/10000000",
        "2/0",
        "F/FFFFFFFF",
        "10/0",
    ]
    assert lsn_to_int("0/10000000") == 0x10000000 and lsn_to_int("10/0") == 0x10_0000_0000
    assert lsn_to_int("f/ffffffff") + 1 == lsn_to_int("10/0")
    assert lsn_to_int("FFFFFFFF/FFFFFFFF") == 2**64 - 1
    for value in (0, 1, 0xFFFFFFF, 0x10000000, 0x1_0FFF_FFFF, 0xF_FFFF_FFFF, 2**64 - 1):
        assert lsn_to_int(int_to_lsn(value)) == value
    assert int_to_lsn(0x1_0000_0028) == "1/28"
    for bad in ("", "0", "0/", "/1", "-1/0", "0/-1", "1/2/3", " 0/1", "0/1 ", "0x1/0", "123456789/0", "G/0"):
        with pytest.raises(ValueError, match="not a WAL position"):
            lsn_to_int(bad)
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="not a WAL position"):
            int_to_lsn(bad)


def test_wal_file_name_of_1mb_segments():
    assert wal_file_name("0/10000000") == "000000010000000000000100"
    assert wal_file_name("1/10000000") == "000000010000000100000100"
    assert wal_file_name("F/FFC00000") == "000000010000000F00000FFC"
    assert wal_file_name("10/0", timeline=2) == "000000020000001000000000"
    assert wal_file_name(0x1_0FFF_FFFF) == "0000000100000001000000FF"  # the segment below 1/10000000


def test_leading_zeros_and_lower_case_parse_and_come_back_in_postgresqls_form():
    assert lsn_to_int("00000001/0000000a") == lsn_to_int("1/A") == 0x1_0000_000A
    assert int_to_lsn(lsn_to_int("00000001/0000000a")) == "1/A"
    assert int_to_lsn(0) == "0/0" and int_to_lsn(2**64 - 1) == "FFFFFFFF/FFFFFFFF"
    assert lsn_to_int("0/FFFFFFFF") + 1 == lsn_to_int("1/0")


@pytest.mark.parametrize(
    "bad",
    ["0/1\n", "\t0/1", "0 /1", "0/ 1", "+0/1", "0/1_0", "000000001/0", "0/000000001", "\uff10/0", "\u0660/0", "0\\1"],
)
def test_anything_but_two_groups_of_one_to_eight_hex_digits_is_refused(bad):
    with pytest.raises(ValueError, match=r"not a WAL position \(pg_lsn\): "):
        lsn_to_int(bad)
