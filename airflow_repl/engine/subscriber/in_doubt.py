"""The resolver of immediate updating: finishes at the publisher the transactions immediate
subscribers prepared there (``airflow-repl resolve-in-doubt`` and :func:`resolve_in_doubt`).

A subscriber transaction that changed an article table prepared a transaction at the publisher
in its commit (:mod:`~airflow_repl.engine.codegen.immediate_triggers`); once the local commit is
done, nothing more can run in PostgreSQL, so this resolver finishes it.  Each prepared
transaction of the subscriber (gid = :func:`~airflow_repl.engine.model.naming.immediate_gid_prefix`
+ the local transaction id) is decided from the subscriber's own record:

- the local transaction committed (``pg_xact_status``; or, when too old to know, its gid is in
  ``airflow_repl.immediate_gids``) -> ``COMMIT PREPARED`` (the transaction names its origin in a
  logical message, so any session may commit it);
- aborted, or not running any more (the subscriber crashed) -> ``ROLLBACK PREPARED``;
- still in progress (its commit is under way) -> left for the next round.

It runs at the start of every Log Reader, Distribution and Queue Reader Agent run of the
publication, and of a Snapshot Agent run before it snapshots (:func:`resolve_quietly`), on demand, and continuously with ``--follow``
(:func:`follow`): the subscriber notifies a channel when such a transaction commits, so the
publisher's locks are released within milliseconds of the subscriber's commit.  (The same
subscriber session's next transaction also commits its predecessor's, first thing.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.codegen.immediate_triggers import CHANNEL
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.postgres.stop_signals import StopSignals
from airflow_repl.engine.state import subscriber_immediate

log = logging.getLogger(__name__)


def immediate_subscribers(topology: Topology, publication: str) -> list[str]:
    """The subscribers of ``publication`` that may update immediately (now or after a switch)."""
    return [s.subscriber for s in topology.subscriptions_of(publication) if s.update_mode.needs_sync_tran]


def resolve_in_doubt(topology: Topology, publication: str, subscriber: str | None = None) -> dict[str, Any]:
    """Resolve the prepared transactions of one immediate subscriber of ``publication`` (all of
    them without ``subscriber``).  Returns ``{subscriber: {committed, rolled_back, in_progress,
    forgotten}}``."""
    if subscriber is not None:
        topology.subscription(publication, subscriber)  # an unknown subscription -> error
    names = [subscriber] if subscriber is not None else immediate_subscribers(topology, publication)
    publisher = topology.publisher.require("publisher")
    totals: dict[str, Any] = {}
    with connections.connect(publisher, "publisher", autocommit=True) as pub:
        for name in names:
            conninfo = topology.subscriber_conninfo(name)
            with connections.connect(conninfo, f"subscriber {name!r}", autocommit=True) as sub:
                totals[name] = resolve(pub, sub, publication, name)
    return totals


def count_in_doubt(pub: psycopg.Connection[Any], publication: str, subscriber: str) -> int:
    """How many transactions of the immediate subscriber are prepared at the publisher, not
    finished yet (in doubt until the resolver, or the subscriber's next transaction, finishes them)."""
    row = pub.execute(
        "SELECT count(*) FROM pg_catalog.pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, %s)",
        (naming.immediate_gid_prefix(publication, subscriber),),
    ).fetchone()
    return int(row[0]) if row is not None else 0


def resolve_quietly(topology: Topology, publication: str, subscribers: list[str] | None = None) -> dict[str, Any]:
    """:func:`resolve_in_doubt` at the start of an agent run: a subscriber or publisher that
    cannot be reached is logged and left for the next round."""
    names = [n for n in immediate_subscribers(topology, publication) if subscribers is None or n in subscribers]
    totals: dict[str, Any] = {}
    for name in names:
        try:
            totals.update(resolve_in_doubt(topology, publication, name))
        except (ReplError, psycopg.Error) as exc:
            log.warning("in-doubt transactions of subscriber %s left for the next round: %s", name, exc)
    return totals


def resolve(
    pub: psycopg.Connection[Any], sub: psycopg.Connection[Any], publication: str, subscriber: str
) -> dict[str, int]:
    """Decide and finish each prepared transaction of the subscriber (both connections in
    autocommit)."""
    prefix = naming.immediate_gid_prefix(publication, subscriber)
    counts = {"committed": 0, "rolled_back": 0, "in_progress": 0, "forgotten": 0}
    if not subscriber_immediate.has_immediate(sub):
        return counts
    listed_at = subscriber_immediate.clock(sub)
    gids = [
        str(r[0])
        for r in pub.execute(
            "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE database = current_database() "
            "AND starts_with(gid, %s) ORDER BY prepared",
            (prefix,),
        )
    ]
    waiting: list[str] = []
    for gid in gids:
        decision = _decide(sub, gid, prefix)
        if decision == "in_progress":
            waiting.append(gid)
        elif not _finish(pub, gid, decision == "committed"):
            continue
        counts[decision] += 1
    counts["forgotten"] = subscriber_immediate.forget_gids(sub, publication, prefix, waiting, listed_at)
    if gids:
        log.info("subscriber %s, publication %s: in-doubt transactions %s", subscriber, publication, counts)
    return counts


def _finish(pub: psycopg.Connection[Any], gid: str, commit: bool) -> bool:
    """COMMIT or ROLLBACK PREPARED; False when another session (the subscriber's next
    transaction, another resolver) finished it first or is finishing it."""
    verb = "COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}"
    try:
        pub.execute(sql.SQL(verb).format(sql.Literal(gid)))
    except (psycopg.errors.UndefinedObject, psycopg.errors.ObjectNotInPrerequisiteState):  # gone, or busy
        return False
    return True


def _decide(sub: psycopg.Connection[Any], gid: str, prefix: str) -> str:
    """committed, rolled_back or in_progress, from the subscriber's local transaction."""
    xid = int(gid[len(prefix) :])
    status, recorded = subscriber_immediate.transaction_outcome(sub, gid, xid)
    if status == "in progress":
        return "in_progress"
    if status == "committed" or (status is None and recorded):
        return "committed"
    return "rolled_back"


def follow(
    topology: Topology, publication: str, subscriber: str, *, interval: float = 60.0, rounds: int | None = None
) -> dict[str, Any]:
    """Resolve continuously: at once when the subscriber notifies a commit, and every
    ``interval`` seconds anyway (``rounds`` rounds, or until SIGINT or SIGTERM).  A server that
    cannot be reached or goes away (a restart) is logged, and the round tried again every
    ``interval`` seconds.  After a signal it ends within one interval, whatever it waits on: a
    notification, the next try, a statement (cancelled).  Returns the totals, with ``ended_by``
    (``rounds``, ``SIGINT`` or ``SIGTERM``) and ``reconnects``.  A server that cannot be reached
    at the start is an error (a wrong connection, not an outage)."""
    topology.subscription(publication, subscriber)
    totals: dict[str, Any] = {
        "committed": 0,
        "rolled_back": 0,
        "in_progress": 0,
        "forgotten": 0,
        "rounds": 0,
        "reconnects": 0,
    }
    servers = _FollowedServers(topology, publication, subscriber, interval)
    with servers, StopSignals(servers.open, cancel_after=0) as stop:
        while not stop.stopped():
            try:
                pub, sub, listener = servers.connected()
                for key, value in resolve(pub, sub, publication, subscriber).items():
                    totals[key] += value
                totals["rounds"] += 1
                if rounds is not None and totals["rounds"] >= rounds:
                    totals["ended_by"] = "rounds"
                    return totals
                stop.wait(interval, _notified(listener))
            except (ReplError, psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if stop.stopped():  # the statement the stop cancelled, or a server gone meanwhile
                    break
                if not servers.ever_connected:  # a wrong connection, not an outage: one clear error
                    raise
                totals["reconnects"] += servers.lost(exc)
                stop.wait(interval)
    totals["ended_by"] = stop.received
    return totals


def _notified(listener: psycopg.Connection[Any]) -> Callable[[float], bool]:
    """Waits up to the seconds given for a notification on ``listener``; whether one came."""
    return lambda seconds: any(True for _ in listener.notifies(timeout=seconds, stop_after=1))


class _FollowedServers:
    """The resolver's three connections (publisher, subscriber, and the subscriber's listener),
    opened again after a server went away."""

    def __init__(self, topology: Topology, publication: str, subscriber: str, interval: float) -> None:
        self.subscriber = subscriber
        self.publisher = topology.publisher.require("publisher")
        self.conninfo = topology.subscriber_conninfo(subscriber)
        #: a try to connect lasts at most about an interval (libpq: whole seconds, at least 2)
        self.timeout = max(2, min(10, math.ceil(interval)))
        self.conns: tuple[psycopg.Connection[Any], ...] = ()
        self.ever_connected = False
        self._outage = False

    def __enter__(self) -> _FollowedServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> tuple[psycopg.Connection[Any], ...]:
        return self.conns

    def connected(self) -> tuple[psycopg.Connection[Any], psycopg.Connection[Any], psycopg.Connection[Any]]:
        """The three connections, opened (and LISTENing) if they are not."""
        if len(self.conns) != 3 or any(c.closed or c.broken for c in self.conns):
            self.close()
            role = f"subscriber {self.subscriber!r}"
            conns = [connections.connect(self.publisher, "publisher", autocommit=True, connect_timeout=self.timeout)]
            try:
                for _ in range(2):
                    conns.append(
                        connections.connect(self.conninfo, role, autocommit=True, connect_timeout=self.timeout)
                    )
                conns[2].execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
            except BaseException:
                for conn in conns:
                    conn.close()
                raise
            self.conns, self.ever_connected = tuple(conns), True
            if self._outage:
                log.warning("resolver of subscriber %s: connected again", self.subscriber)
                self._outage = False
        pub, sub, listener = self.conns
        return pub, sub, listener

    def lost(self, exc: BaseException) -> int:
        """A server could not be reached or went away: logged (once per outage), the connections
        closed for the next try.  Returns 1 when this starts an outage."""
        self.close()
        if self._outage:
            log.debug("resolver of subscriber %s: still cannot reach a server: %s", self.subscriber, exc)
            return 0
        self._outage = True
        text = str(exc).strip()
        log.warning(
            "resolver of subscriber %s: %s; trying again every interval",
            self.subscriber,
            text.splitlines()[0] if text else type(exc).__name__,
        )
        return 1

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns = ()
