"""The streaming replication protocol's messages (no server): the START_REPLICATION command, the
standby status update and the server's XLogData and keepalive messages."""

from __future__ import annotations

import struct
import time

import psycopg
import pytest

from airflow_repl.engine.postgres import pgoutput, replication_stream


def test_start_command_quotes_the_slot_the_option_names_and_their_values():
    command = replication_stream.start_command(
        'my"slot',
        0x1_0000_00A0,
        {"proto_version": "1", "publication_names": replication_stream.quoted_names(["a", 'b"c'])},
    )
    assert command == (
        b'START_REPLICATION SLOT "my""slot" LOGICAL 1/A0 ("proto_version" \'1\', "publication_names" \'"a","b""c"\')'
    )
    assert b"LOGICAL 0/0 " in replication_stream.start_command("s", 0, {})  # 0: where the slot was confirmed
    assert b"'it''s'" in replication_stream.start_command("s", 0, {"x": "it's"})


def test_a_status_update_reports_one_position_as_written_flushed_and_applied():
    before = int((time.time() - pgoutput.PG_EPOCH.timestamp()) * 1_000_000)
    message = replication_stream.status_message(0xFFFF_FFFF_0000_0001, reply=True)
    after = int((time.time() - pgoutput.PG_EPOCH.timestamp()) * 1_000_000)
    kind, written, flushed, applied, clock, reply = struct.unpack("!cQQQqB", message)
    assert (kind, written, flushed, applied, reply) == (
        b"r",
        0xFFFF_FFFF_0000_0001,
        0xFFFF_FFFF_0000_0001,
        0xFFFF_FFFF_0000_0001,
        1,
    )
    assert before - 1000 <= clock <= after + 1000  # microseconds since 2000-01-01 UTC
    assert replication_stream.status_message(5)[-1] == 0  # no reply asked


def test_xlogdata_gives_its_wal_start_and_the_plugin_message():
    payload = b"C\x00" + bytes(24)
    data = b"w" + struct.pack("!QQq", 0x2_0000_0010, 0x2_0000_0020, 123) + payload
    assert replication_stream.parse_message(memoryview(data)) == (0x2_0000_0010, payload, False)
    empty = b"w" + struct.pack("!QQq", 7, 7, 0)
    assert replication_stream.parse_message(empty) == (7, b"", False)


def test_a_keepalive_gives_the_servers_position_and_whether_it_wants_a_reply():
    assert replication_stream.parse_message(b"k" + struct.pack("!QqB", 0xA_0000_0000, 0, 1)) == (
        0xA_0000_0000,
        None,
        True,
    )
    assert replication_stream.parse_message(b"k" + struct.pack("!QqB", 5, 0, 0)) == (5, None, False)


@pytest.mark.parametrize("data", [b"x123", b"w" + bytes(10), b"k" + bytes(3)])
def test_an_unknown_or_short_message_is_an_error_not_a_guess(data):
    with pytest.raises(psycopg.OperationalError, match="unexpected replication message"):
        replication_stream.parse_message(data)
