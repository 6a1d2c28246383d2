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

A switch changes which triggers are enabled on the subscriber's article tables, in one
subscriber transaction: the queue trigger (queued) or the two immediate-updating triggers
(:mod:`~airflow_repl.engine.codegen.immediate_triggers`); the Snapshot Agent installs both for a
failover subscription.  To immediate, the queue is checked empty again once the tables are locked
by that switch, so no change slips into the queue meanwhile.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import immediate_triggers, queue_triggers
from airflow_repl.engine.errors import NotInitialized, ReplError, TopologyError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.model.updating import UpdateMode
from airflow_repl.engine.postgres import connections, trigger_switching
from airflow_repl.engine.runtime import registry
from airflow_repl.engine.state import dist_history, dist_publications, dist_schema, dist_subscriptions, subscriber_queue

log = logging.getLogger(__name__)

#: ``--mode`` -> the subscription's update mode while in it.
TARGETS = {"immediate": UpdateMode.FAILOVER, "queued": UpdateMode.QUEUED_FAILOVER}
#: The Queue Reader Agent's name in ``airflow_repl.agent_history``.
QUEUE_READER = registry.AGENTS["queuereader"].name


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
        dist_schema.ensure_schema(dist)
        current = _recorded_mode(dist, publication, subscriber)
        if current is not target:
            if target is UpdateMode.FAILOVER:
                _check_queue_drained(dist, topology, publication, subscriber)
            _switch_triggers(dist, topology, publication, subscriber, immediate=target is UpdateMode.FAILOVER)
            dist_subscriptions.set_update_mode(dist, publication, subscriber, str(target))
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
    state = dist_subscriptions.subscription_updating(dist, publication, subscriber)
    if state is None or state.update_mode not in dist_subscriptions.FAILOVER_MODES:
        raise NotInitialized(
            f"the distribution database does not record subscription of {subscriber!r} to publication "
            f"{publication!r} as a failover subscription: run 'airflow-repl apply' with the topology first"
        )
    return UpdateMode(state.update_mode)


def _check_queue_drained(dist: psycopg.Connection[Any], topology: Topology, publication: str, subscriber: str) -> None:
    """queued -> immediate: initialized, the Queue Reader has run since, and nothing is queued."""
    state = dist_subscriptions.subscription_updating(dist, publication, subscriber)
    if state is None or state.status != "active" or state.initialized_at is None:
        raise NotInitialized(
            f"subscription of {subscriber!r} to publication {publication!r} is not initialized: run the Snapshot "
            f"Agent for it, then the Queue Reader Agent, before switching it to immediate updating"
        )
    if not dist_history.agent_succeeded_since(dist, QUEUE_READER, publication, subscriber, state.initialized_at):
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


def _switch_triggers(
    dist: psycopg.Connection[Any], topology: Topology, publication: str, subscriber: str, *, immediate: bool
) -> None:
    """Enable the triggers of the new mode and disable the others on every article table at the
    subscriber (one transaction, committed here); to immediate, the queue must still be empty."""
    articles = dist_publications.load_articles(dist, publication)
    dist.rollback()
    conninfo = topology.subscriber_conninfo(subscriber)
    on, off = (_IMMEDIATE, _QUEUE) if immediate else (_QUEUE, _IMMEDIATE)
    with connections.connect(conninfo, f"subscriber {subscriber!r}") as sub:
        for art in articles:
            for names, enabled in ((_present(sub, art, off), False), (_present(sub, art, on), True)):
                if names:
                    sub.execute(
                        trigger_switching.switch_triggers(art.dest_schema, art.dest_table, names, enabled=enabled)
                    )
            if len(_present(sub, art, on)) < len(on):
                raise NotInitialized(
                    f"table {art.destination} of subscriber {subscriber!r} lacks the {' and '.join(on)} trigger(s) of "
                    f"publication {publication!r}: run the Snapshot Agent for it (reinitialize) first"
                )
        waiting = subscriber_queue.queued_rows(sub, publication) if immediate else 0
        if waiting:
            sub.rollback()
            raise NotInitialized(
                f"{waiting} change(s) of subscriber {subscriber!r} were queued for publication {publication!r} "
                f"meanwhile: run 'airflow-repl queuereader' until the queue is empty, then switch to immediate updating"
            )
        sub.commit()


_QUEUE = (queue_triggers.TRIGGER,)
_IMMEDIATE = (immediate_triggers.ROW_TRIGGER, immediate_triggers.COMMIT_TRIGGER)


def _present(sub: psycopg.Connection[Any], art: ResolvedArticle, names: tuple[str, ...]) -> list[str]:
    """Which of the triggers ``names`` exist on the article's table at the subscriber."""
    rows = sub.execute(
        "SELECT tgname FROM pg_catalog.pg_trigger WHERE tgrelid = to_regclass(%s) AND tgname = ANY(%s)",
        (sql.Identifier(art.dest_schema, art.dest_table).as_string(sub), list(names)),
    ).fetchall()
    return [str(r[0]) for r in rows]
