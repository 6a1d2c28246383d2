"""Switching a failover subscription between immediate and queued updating (SQL Server's
``sp_setreplfailovermode``): ``airflow-repl set-update-mode`` and :func:`set_update_mode`.

The distribution database records each subscription's current mode in
``airflow_repl.subscriptions.update_mode``: ``failover`` (immediate now) or ``queued failover``
(queued now).  Rules:

- only a failover subscription (topology ``update_mode: failover`` or ``queued failover``) switches;
- immediate -> queued: at any time;
- queued -> immediate: only once the Queue Reader Agent has run successfully since the
  subscription was initialized, and the subscriber's queue is empty;
- nothing switches by itself.

Immediate updating itself is not available yet, so a switch to immediate that passes the rules
is still refused, naming that.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from airflow_repl.engine.errors import NotInitialized, ReplError, TopologyError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.model.updating import UpdateMode
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.state import distdb, subscriber_queue

log = logging.getLogger(__name__)

#: ``--mode`` -> the subscription's update mode while in it.
TARGETS = {"immediate": UpdateMode.FAILOVER, "queued": UpdateMode.QUEUED_FAILOVER}
#: The Queue Reader Agent's name in ``airflow_repl.agent_history``.
QUEUE_READER = "queuereader"


def set_update_mode(topology: Topology, publication: str, subscriber: str, mode: str) -> dict[str, Any]:
    """Switch the subscription of ``subscriber`` to ``publication`` to ``mode`` (``queued`` or
    ``immediate``); returns ``{publication, subscriber, update_mode, previous, changed}``.  A
    refusal raises one line naming what to run."""
    target = _target(mode)
    sub = topology.subscription(publication, subscriber)
    if not sub.update_mode.failover:
        raise TopologyError(
            f"subscription of {subscriber!r} to publication {publication!r} has update_mode "
            f"{str(sub.update_mode)!r}; only a failover subscription switches between immediate and queued "
            f"updating: set update_mode 'failover' or 'queued failover' in the topology and apply it"
        )
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        distdb.ensure_schema(dist)
        current = _recorded_mode(dist, publication, subscriber)
        if current is not target:
            if target is UpdateMode.FAILOVER:
                _check_queue_drained(dist, topology, publication, subscriber)
                _refuse_immediate(publication, subscriber)
            distdb.set_update_mode(dist, publication, subscriber, str(target))
            dist.commit()
            log.info("subscription %s/%s: update mode %s -> %s", publication, subscriber, current, target)
    return {
        "publication": publication,
        "subscriber": subscriber,
        "update_mode": str(target),
        "previous": str(current),
        "changed": current is not target,
    }


def _target(mode: str) -> UpdateMode:
    try:
        return TARGETS[mode.strip().lower()]
    except KeyError:
        raise ReplError(f"update mode {mode!r} is not one of: {', '.join(TARGETS)}") from None


def _recorded_mode(dist: psycopg.Connection[Any], publication: str, subscriber: str) -> UpdateMode:
    """The subscription's current mode as recorded by ``apply`` or the last switch."""
    state = distdb.subscription_updating(dist, publication, subscriber)
    if state is None or state.update_mode not in distdb.FAILOVER_MODES:
        raise NotInitialized(
            f"the distribution database does not record subscription of {subscriber!r} to publication "
            f"{publication!r} as a failover subscription: run 'airflow-repl apply' with the topology first"
        )
    return UpdateMode(state.update_mode)


def _check_queue_drained(dist: psycopg.Connection[Any], topology: Topology, publication: str, subscriber: str) -> None:
    """queued -> immediate: initialized, the Queue Reader has run since, and nothing is queued."""
    state = distdb.subscription_updating(dist, publication, subscriber)
    if state is None or state.status != "active" or state.initialized_at is None:
        raise NotInitialized(
            f"subscription of {subscriber!r} to publication {publication!r} is not initialized: run the Snapshot "
            f"Agent for it, then the Queue Reader Agent, before switching it to immediate updating"
        )
    if not distdb.agent_succeeded_since(dist, QUEUE_READER, publication, subscriber, state.initialized_at):
        raise NotInitialized(
            f"the Queue Reader Agent has not run successfully for subscriber {subscriber!r} of publication "
            f"{publication!r} since it was initialized ({state.initialized_at:%Y-%m-%d %H:%M:%S %Z}): run "
            f"'airflow-repl queuereader' for it, then switch to immediate updating"
        )
    dist.rollback()
    conninfo = topology.subscriber_conninfo(subscriber)
    with connections.connect(conninfo, f"subscriber {subscriber!r}", autocommit=True) as sub:
        waiting = subscriber_queue.queued_rows(sub, publication)
    if waiting:
        raise NotInitialized(
            f"{waiting} queued change(s) of subscriber {subscriber!r} wait in its queue for publication "
            f"{publication!r}: run 'airflow-repl queuereader' until the queue is empty, then switch to immediate "
            f"updating"
        )


def _refuse_immediate(publication: str, subscriber: str) -> None:
    raise ReplError(
        f"subscription of {subscriber!r} to publication {publication!r} may switch to immediate updating, but "
        f"immediate updating is not available yet: it stays in queued updating"
    )
