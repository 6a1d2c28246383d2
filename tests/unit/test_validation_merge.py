"""Validation's pure parts, without a server: the ranges that differ, the merge of both sides'
rows of those ranges by key, and the text report."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model.topology import from_dict
from airflow_repl.engine.subscriber import validation
from airflow_repl.engine.subscriber.validation import DIFFERENT, EXTRA, MISSING


def rows(*items: tuple[str, str]) -> list[tuple[bytes, str, str]]:
    """(key bytes, key text, row hash) in the byte order the servers sort them in."""
    return sorted((f"({k})".encode(), f"({k})", h) for k, h in items)


def test_merge_finds_each_kind_of_difference_and_counts_all():
    pub = rows(("a", "1"), ("b", "2"), ("c", "3"), ("e", "5"))
    sub = rows(("b", "2"), ("c", "X"), ("d", "4"), ("e", "5"))
    found = validation.merge_rows(pub, sub, max_keys=10)
    assert (found["missing"], found["extra"], found["different"]) == (1, 1, 1)
    assert found["differences"] == [
        {"key": "(a)", "difference": MISSING},
        {"key": "(c)", "difference": DIFFERENT},
        {"key": "(d)", "difference": EXTRA},
    ]


def test_merge_lists_at_most_max_keys_but_counts_every_row():
    pub = rows(*((f"k{i:04d}", "h") for i in range(500)))
    found = validation.merge_rows(pub, [], max_keys=3)
    assert found["missing"] == 500 and [d["key"] for d in found["differences"]] == ["(k0000)", "(k0001)", "(k0002)"]
    assert validation.merge_rows([], pub, max_keys=0) == {"missing": 0, "extra": 500, "different": 0, "differences": []}


def test_merge_of_equal_sides_and_of_empty_sides_reports_nothing():
    same = rows(("x", "1"), ("y", "2"))
    assert validation.merge_rows(same, list(same), 5)["differences"] == []
    assert validation.merge_rows([], [], 5) == {"missing": 0, "extra": 0, "different": 0, "differences": []}


def test_merge_compares_key_bytes_not_text_order():
    # bytes order: b"(B)" < b"(a)" (upper case first), whatever a collation would say
    pub = rows(("a", "1"), ("B", "2"))
    sub = rows(("B", "2"), ("a", "1"))
    assert validation.merge_rows(pub, sub, 5)["differences"] == []


def test_differing_ranges_include_ranges_present_on_one_side_only():
    pub = {0: [2, 10, 20], 3: [1, 5, 6], 7: [1, 1, 1]}
    sub = {0: [2, 10, 20], 3: [1, 5, 7], 9: [1, 2, 2]}
    assert validation.differing_ranges(pub, sub) == [3, 7, 9]
    assert validation.differing_ranges(pub, dict(pub)) == []


def test_article_row_totals_and_match():
    same = {1: [2, 3, 4], 2: [1, 1, 1]}
    row = validation.article_row("a", same, dict(same), 16)
    assert row["match"] and row["publisher_rows"] == row["subscriber_rows"] == 3
    assert row["publisher_checksum"] == row["subscriber_checksum"] and row["differing_ranges"] == 0
    other = validation.article_row("a", same, {1: [2, 3, 4]}, 16)
    assert not other["match"] and other["differing_ranges"] == 1 and other["subscriber_rows"] == 2


def test_report_lists_the_keys_and_says_how_many_more_differ():
    row = validation.article_row("orders", {1: [2, 3, 4]}, {1: [1, 3, 3]}, 16)
    row.update({"missing": 4, "differences": [{"key": "(1)", "difference": MISSING}]})
    lines = validation.format_report([row]).splitlines()
    assert lines[1].startswith("orders") and lines[1].endswith("NO")
    assert lines[2] == "    key (1): missing at the subscriber"
    assert lines[3] == "    ... and 3 more key(s) (raise --max-keys to list them)"
    assert validation.matches({"s": [row]}) is False and validation.matches({"s": []}) is True
    same = validation.article_row("items", {}, {}, 16)
    assert validation.differences_line("shop", {"s": [row, same]}) == (
        "validation of publication 'shop' found differences at s/orders (4 missing, 0 extra, 0 different)"
    )


def test_out_of_range_options_are_refused_before_any_server_is_reached():
    topo = from_dict(
        {
            "publisher": "postgresql://u@127.0.0.1:1/p",
            "distributor": "postgresql://u@127.0.0.1:1/d",
            "subscribers": {"s": "postgresql://u@127.0.0.1:1/s"},
            "publications": [{"name": "p", "articles": ["public.t"]}],
            "subscriptions": [{"publication": "p", "subscriber": "s"}],
        }
    )
    with pytest.raises(ReplError, match=r"needs ranges from 1 to 65536 and max_keys >= 0 \(got ranges 70000"):
        validation.validate(topo, "p", ["s"], ranges=70000)
    with pytest.raises(ReplError, match="got ranges 8 and max_keys -1"):
        validation.validate(topo, "p", ["s"], ranges=8, max_keys=-1)


def test_block_chunks_cover_every_block_once_and_the_last_is_open():
    assert validation.block_chunks(0) == [[None, None]]
    assert validation.block_chunks(100, per_task=1000) == [[None, None]]
    assert validation.block_chunks(100, per_task=30) == [[None, 25], [25, 50], [50, 75], [75, None]]
    many = validation.block_chunks(10**6, per_task=10, max_chunks=8)
    assert len(many) == 8 and many[0][0] is None and many[-1][1] is None
    assert all(a[1] == b[0] for a, b in itertools.pairwise(many))


def test_sums_of_chunks_add_up():
    total = validation.add_sums({}, {1: [2, 10, -4]})
    validation.add_sums(total, {1: [1, 5, 4], 3: [1, 1, 1]})
    assert total == {1: [3, 15, 0], 3: [1, 1, 1]}


def test_key_range_in_python_is_the_sql_rule():
    # ('x' || lpad(left(md5('[17]'), 8), 16, '0'))::bit(64)::bigint * 256 >> 32, as the server computes it
    assert validation.key_range(b"[17]", 256) == (int(hashlib.md5(b"[17]").hexdigest()[:8], 16) * 256) >> 32
    spread = {validation.key_range(str(i).encode(), 16) for i in range(1000)}
    assert spread == set(range(16))  # every range used, none outside
    assert validation.key_range(b"anything", 1) == 0


def test_rows_hashed_off_the_server_sum_as_the_sql_halves():
    sums: validation.Sums = {}
    digest = bytes(range(16))
    validation.add_row(sums, 3, digest)
    validation.add_row(sums, 3, b"\xff" * 16)  # -1 and -1 as signed 64-bit halves
    assert sums == {3: [2, int.from_bytes(digest[:8], "big") - 1, int.from_bytes(digest[8:], "big") - 1]}
    # the same rows in any order, split over tasks: the same sums
    a, b = {}, {}
    validation.add_row(a, 3, b"\xff" * 16)
    validation.add_row(b, 3, digest)
    assert validation.add_sums(a, b) == sums
