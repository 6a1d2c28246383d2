"""The checks behind the quiescing sensors (:mod:`airflow_repl.sensors`): has a tracer token
reached its subscribers (:func:`check_token_arrived`), is a topology quiesced up to a position
(:func:`check_quiesced`)?  Each returns a :class:`WaitStatus` whose ``message`` names what is
behind, by how much, and the agent to run.

Quiesced up to a position (the publisher's WAL position when the wait started, or a tracer
token's commit) means:

- read: the publication's slot was advanced to or past it (the Log Reader stores every
  transaction before it advances the slot, and advances an idle slot only up to what it found
  nothing more in, so everything committed before the position is stored);
- delivered: every active subscription's delivered watermark is at or past every stored
  transaction committed at or before it;
- drained: every queued-updating subscriber's queue is empty (the Queue Reader applied it at
  the publisher);
- decided: no immediate-updating transaction is prepared at the publisher, waiting for its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from airflow_repl.engine.errors import NotInitialized, ReplError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections, lsn, slots
from airflow_repl.engine.state import dist_publications, progress, subscriber_queue
from airflow_repl.engine.subscriber import in_doubt

LOG_READER, DISTRIBUTION, QUEUE_READER, RESOLVER = "Log Reader", "Distribution", "Queue Reader", "resolve-in-doubt"


@dataclass(frozen=True)
class Lag:
    """Something behind: the subscriber (None: the publication's Log Reader), how many
    transactions (queued changes, in-doubt transactions; WAL bytes for the Log Reader) and the
    agent whose run catches it up."""

    subscriber: str | None
    behind: int
    agent: str
    message: str


@dataclass(frozen=True)
class WaitStatus:
    """The outcome of one check: done, or what is behind."""

    publication: str
    position: str | None  # what the check waits for (a WAL position, a token's commit LSN)
    lags: tuple[Lag, ...]

    @property
    def done(self) -> bool:
        return not self.lags

    @property
    def failed(self) -> bool:
        """Never: what is behind can catch up (a health check's critical breach cannot wait)."""
        return False

    @property
    def message(self) -> str:
        if self.done:
            return f"publication {self.publication!r} is caught up to {self.position}"
        return "; ".join(lag.message for lag in self.lags)


def start_position(topology: Topology, publication: str) -> str:
    """The publisher's WAL position now: every transaction committed so far ends before it."""
    topology.publication(publication)
    with connections.connect(topology.publisher.require("publisher"), "publisher") as pub:
        return slots.current_wal_lsn(pub)


# ---------------------------------------------------------------------- tracer tokens
def check_token_arrived(
    topology: Topology, publication: str, token_id: int, subscribers: list[str] | None = None
) -> WaitStatus:
    """Has tracer token ``token_id`` reached every subscriber it is meant for (or the named ones)?"""
    for name in subscribers or []:
        topology.subscription(publication, name)  # an unknown subscription -> TopologyError
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        token = _token(dist, publication, token_id)
        if token.xact_seqno is None:
            return WaitStatus(publication, None, (_unread(publication, token_id),))
        rows = progress.history(dist, publication, token_id)
        behind = {b.subscriber: b.transactions for b in progress.delivery_behind(dist, publication, token.xact_seqno)}
    meant = {r.subscriber: r.subscriber_at for r in rows}
    missing = [s for s in subscribers or [] if s not in meant]
    if missing:
        raise NotInitialized(
            f"tracer token {token_id} of publication {publication!r} is not meant for subscriber(s) "
            f"{', '.join(missing)} (not active, or initialized after the token): it never reaches them"
        )
    lags = [
        Lag(s, behind.get(s, 0), DISTRIBUTION, _token_lag(token_id, publication, s, behind.get(s, 0)))
        for s in (subscribers or sorted(meant))
        if meant[s] is None
    ]
    return WaitStatus(publication, token.xact_seqno, tuple(lags))


def _token(dist: psycopg.Connection[Any], publication: str, token_id: int) -> progress.TokenState:
    dist_publications.load_articles(dist, publication)  # a publication not deployed -> NotInitialized
    token = progress.token(dist, publication, token_id)
    if token is None:
        raise NotInitialized(
            f"publication {publication!r} has no tracer token {token_id}: post one with 'airflow-repl tracer post'"
        )
    return token


def _unread(publication: str, token_id: int) -> Lag:
    return Lag(
        None,
        0,
        LOG_READER,
        f"tracer token {token_id} of publication {publication!r} has not been read from the publisher yet: "
        f"run the Log Reader Agent",
    )


def _token_lag(token_id: int, publication: str, subscriber: str, transactions: int) -> str:
    return (
        f"tracer token {token_id} has not reached subscriber {subscriber!r}: subscription {publication} -> "
        f"{subscriber} is {transactions} transaction(s) behind it: run the Distribution Agent for {subscriber}"
    )


# ---------------------------------------------------------------------- quiesced
def check_quiesced(
    topology: Topology, publication: str, *, position: str | None = None, token_id: int | None = None
) -> WaitStatus:
    """Is the topology quiesced up to ``position`` (or tracer token ``token_id``'s commit)?"""
    topology.publication(publication)
    if (position is None) == (token_id is None):
        raise ReplError("a quiesce check needs a position or a tracer token, exactly one of them")
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        if token_id is not None:
            position = _token(dist, publication, token_id).xact_seqno
            if position is None:
                return WaitStatus(publication, None, (_unread(publication, token_id),))
        assert position is not None
        dist_publications.load_articles(dist, publication)
        slot = dist_publications.slot_name(dist, publication)
        behind = progress.delivery_behind(dist, publication, position)
    with connections.connect(topology.publisher.require("publisher"), "publisher", autocommit=True) as pub:
        lags = _read_lag(pub, publication, slot, position) if token_id is None else []
        lags += [_delivery_lag(publication, position, b) for b in behind if b.transactions]
        lags += _queue_lags(topology, publication)
        lags += _in_doubt_lags(pub, topology, publication)
    return WaitStatus(publication, position, tuple(lags))


def _read_lag(pub: psycopg.Connection[Any], publication: str, slot: str, position: str) -> list[Lag]:
    read = slots.confirmed_flush_lsn(pub, slot)
    if read is None:
        raise NotInitialized(
            f"publication {publication!r} has no replication slot {slot!r} at the publisher: run the Snapshot Agent"
        )
    gap = lsn.lsn_to_int(position) - lsn.lsn_to_int(read)
    if gap <= 0:
        return []
    return [
        Lag(
            None,
            gap,
            LOG_READER,
            f"the Log Reader of publication {publication!r} has read up to {read}, {gap} byte(s) of WAL before "
            f"position {position}: run the Log Reader Agent",
        )
    ]


def _delivery_lag(publication: str, position: str, behind: progress.Behind) -> Lag:
    s = behind.subscriber
    return Lag(
        s,
        behind.transactions,
        DISTRIBUTION,
        f"subscription {publication} -> {s} is {behind.transactions} transaction(s) behind position {position} "
        f"(delivered up to {behind.delivered}): run the Distribution Agent for {s}",
    )


def _queue_lags(topology: Topology, publication: str) -> list[Lag]:
    """Queued-updating subscribers with changes still in their queue."""
    lags = []
    for sub in topology.subscriptions_of(publication):
        if not (sub.update_mode.queued or sub.update_mode.failover):
            continue
        with connections.connect(topology.subscriber_conninfo(sub.subscriber), f"subscriber {sub.subscriber!r}") as c:
            n = subscriber_queue.queued_rows(c, publication)
        if n:
            message = (
                f"subscriber {sub.subscriber!r} has {n} queued change(s) of publication {publication!r} not yet "
                f"applied at the publisher: run the Queue Reader Agent (then the Log Reader and Distribution Agents)"
            )
            lags.append(Lag(sub.subscriber, n, QUEUE_READER, message))
    return lags


def _in_doubt_lags(pub: psycopg.Connection[Any], topology: Topology, publication: str) -> list[Lag]:
    """Immediate-updating subscribers with transactions prepared at the publisher, undecided."""
    lags = []
    for name in in_doubt.immediate_subscribers(topology, publication):
        n = in_doubt.count_in_doubt(pub, publication, name)
        if n:
            message = (
                f"{n} immediate-updating transaction(s) of subscriber {name!r} are in doubt at the publisher: "
                f"run 'airflow-repl resolve-in-doubt' (any agent run of publication {publication!r} resolves them too)"
            )
            lags.append(Lag(name, n, RESOLVER, message))
    return lags


def require_quiesced(topology: Topology, publication: str, token_id: int, doing: str) -> None:
    """ReplError, naming what is behind, unless the topology is quiesced up to tracer token
    ``token_id`` (checked before ``doing``, e.g. a schema change the DAG asked to quiesce for)."""
    status = check_quiesced(topology, publication, token_id=token_id)
    if not status.done:
        raise ReplError(
            f"{doing} refused: publication {publication!r} is not quiesced up to tracer token {token_id}: "
            f"{status.message}"
        )
