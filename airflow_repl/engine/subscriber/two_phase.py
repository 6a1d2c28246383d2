"""A batch committed over several subscription streams by two-phase commit, whatever the
subscriber's engine: the names of its prepared transactions and what recovery decides of a
batch a dead agent left prepared.  Pure logic, no server.

A batch's prepared transaction on stream ``i`` of ``n`` is named ``airflow_repl|<publication
tag>|<batch>|<last xact_seqno>|<i>|<n>`` (:func:`gid`): at a PostgreSQL subscriber the tag is
the publication's name; at a MariaDB subscriber, whose XA identifiers hold 64 bytes and are
seen server-wide, a stable hash of the database and the publication
(:mod:`~airflow_repl.engine.subscriber.mariadb_streams`).  Stream 0's transaction holds the
subscriber's watermark.

:func:`recovery` decides: a batch the committed watermark already reached committed on stream
0, so its other streams commit too; a batch prepared on every stream commits; anything else
(the prepare phase was cut short, or a rollback of the batch was interrupted) is rolled back.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_repl.engine.postgres import lsn

GID_PREFIX = "airflow_repl"


def gid(tag: str, batch: str, last: str, stream: int, streams: int) -> str:
    """The name of the batch's prepared transaction on ``stream`` (of ``streams``)."""
    return f"{GID_PREFIX}|{tag}|{batch}|{last}|{stream}|{streams}"


def gid_prefix(tag: str) -> str:
    """What every gid of the publication (tag) starts with."""
    return f"{GID_PREFIX}|{tag}|"


@dataclass(frozen=True)
class Prepared:
    """One prepared transaction of a batch, from its gid."""

    gid: str
    batch: str
    last: str
    stream: int
    streams: int


def parse(name: str) -> Prepared:
    """A gid made by :func:`gid` (the tag may hold ``|``: the other parts are read from the end)."""
    _, batch, last, stream, streams = name.rsplit("|", 4)
    return Prepared(name, batch, last, int(stream), int(streams))


def recovery(prepared: list[Prepared], watermark: str | None) -> list[tuple[bool, list[Prepared]]]:
    """Each batch among ``prepared`` (of one publication at one subscriber) with whether it
    commits, given the subscriber's committed ``watermark``; each batch's transactions in the
    order to finish them, stream 0 (the watermark) last."""
    reached = lsn.lsn_to_int(watermark) if watermark is not None else -1
    batches: dict[tuple[str, str], list[Prepared]] = {}
    for p in prepared:
        batches.setdefault((p.batch, p.last), []).append(p)
    out = []
    for (_, last), members in batches.items():
        every_stream = {m.stream for m in members} == set(range(members[0].streams))
        commit = reached >= lsn.lsn_to_int(last) or every_stream
        out.append((commit, sorted(members, key=lambda m: m.stream, reverse=True)))
    return out
