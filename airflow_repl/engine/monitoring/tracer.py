"""Tracer tokens (SQL Server's ``sp_posttracertoken`` and ``sp_helptracertokenhistory``):
:func:`post_tracer_token` posts one at the publisher, :func:`tracer_history` lists, per token
and subscriber, the latency of each hop.

A token is a transactional logical message (prefix
:data:`~airflow_repl.engine.model.naming.TRACER_MESSAGE`) in a publisher transaction of its own
that changes no table.  The Log Reader stores that transaction like any other (with no commands)
and records the token's commit LSN and the distributor's time; the Distribution Agent delivers
past it in commit order and records, per subscriber, when its watermark passed the token.

Posting: the token's row is inserted (and committed) at the distributor first, which gives its
id; then the message is committed at the publisher.  If the publisher fails, the row is deleted
again (a row left behind by a distributor lost meanwhile stays "not read"); if the publisher
committed but the client could not tell, the Log Reader enters the token from its message.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg

from airflow_repl.engine.errors import NotInitialized
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections, slots
from airflow_repl.engine.state import dist_publications, progress


def post_tracer_token(topology: Topology, publication: str) -> int:
    """Post a tracer token for ``publication`` at the publisher; returns its id."""
    topology.publication(publication)  # an unknown publication -> TopologyError
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        with connections.connect(topology.publisher.require("publisher"), "publisher") as pub:
            _check_slot(dist, pub, publication)
            token_id = progress.insert_token(dist, publication)
            dist.commit()
            try:
                posted_at = _emit(pub, token_id, publication)
            except BaseException:
                _forget(dist, token_id)
                raise
        progress.set_posted(dist, token_id, posted_at)
        dist.commit()
    return token_id


def _check_slot(dist: psycopg.Connection[Any], pub: psycopg.Connection[Any], publication: str) -> None:
    """The publication is deployed and has its slot (else no Log Reader would ever read the token)."""
    dist_publications.load_articles(dist, publication)
    slot = dist_publications.slot_name(dist, publication)
    dist.rollback()
    found = slots.exists(pub, slot)
    pub.rollback()
    if not found:
        raise NotInitialized(
            f"publication {publication!r} has no replication slot {slot!r} at the publisher, so no Log Reader "
            f"would read a tracer token: run the Snapshot Agent first"
        )


def _emit(pub: psycopg.Connection[Any], token_id: int, publication: str) -> datetime:
    """Commit the token's message at the publisher, alone in its transaction; the publisher's time."""
    row = pub.execute(
        "SELECT pg_catalog.pg_logical_emit_message(true, %s, json_build_object('token_id', %s::bigint, "
        "'publication', %s::text, 'posted_at', now.at)::text), now.at FROM (SELECT clock_timestamp() AS at) AS now",
        (naming.TRACER_MESSAGE, token_id, publication),
    ).fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    pub.commit()
    return row[1]  # type: ignore[no-any-return]


def _forget(dist: psycopg.Connection[Any], token_id: int) -> None:
    """Delete the row of a token whose posting failed (best effort: it stays "not read" otherwise)."""
    try:
        progress.delete_token(dist, token_id)
        dist.commit()
    except psycopg.Error:
        pass


# ---------------------------------------------------------------------- history
@dataclass(frozen=True)
class Latency:
    """One token at one subscriber; seconds per hop, None while pending."""

    token_id: int
    subscriber: str
    posted_at: datetime
    distributor_at: datetime | None
    subscriber_at: datetime | None
    publisher_to_distributor: float | None
    distributor_to_subscriber: float | None
    total: float | None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("posted_at", "distributor_at", "subscriber_at"):
            out[key] = out[key].isoformat() if out[key] is not None else None
        return out


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


def tracer_history(topology: Topology, publication: str, token_id: int | None = None) -> list[Latency]:
    """Per token (or the one) and subscriber: posted, publisher->distributor,
    distributor->subscriber and total latency (None: pending)."""
    topology.publication(publication)
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        dist_publications.load_articles(dist, publication)
        if token_id is not None and progress.token(dist, publication, token_id) is None:
            raise NotInitialized(f"publication {publication!r} has no tracer token {token_id}: see 'tracer history'")
        rows = progress.history(dist, publication, token_id)
    return [latency(r) for r in rows]


def latency(row: progress.HistoryRow) -> Latency:
    """A token at one subscriber, with its seconds per hop."""
    return Latency(
        row.token_id,
        row.subscriber,
        row.posted_at,
        row.distributor_at,
        row.subscriber_at,
        _seconds(row.posted_at, row.distributor_at),
        _seconds(row.distributor_at, row.subscriber_at),
        _seconds(row.posted_at, row.subscriber_at),
    )


def format_history(rows: list[Latency]) -> str:
    """The history as a text table (pending hops say so)."""
    header = ("token", "subscriber", "posted at", "publisher->distributor", "distributor->subscriber", "total")
    lines = [header] + [
        (
            str(r.token_id),
            r.subscriber,
            r.posted_at.isoformat(timespec="milliseconds"),
            _cell(r.publisher_to_distributor),
            _cell(r.distributor_to_subscriber),
            _cell(r.total),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def _cell(seconds: float | None) -> str:
    return "pending" if seconds is None else f"{seconds:.3f} s"


def history_json(rows: list[Latency]) -> str:
    return json.dumps([r.to_json() for r in rows], indent=2)


def latency_summary(rows: list[Latency]) -> dict[str, dict[str, float | int]]:
    """Per hop (publisher->distributor, distributor->subscriber, total): how many tokens
    arrived, the median and the worst latency in seconds (pending hops are left out)."""
    out: dict[str, dict[str, float | int]] = {}
    for hop in ("publisher_to_distributor", "distributor_to_subscriber", "total"):
        values = sorted(v for r in rows if (v := getattr(r, hop)) is not None)
        if values:
            out[hop] = {"tokens": len(values), "median": round(statistics.median(values), 3), "worst": values[-1]}
    return out
