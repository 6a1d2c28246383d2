"""Pausing and resuming one subscription (SQL Server stops and starts one subscription's
Distribution Agent; PostgreSQL has ``ALTER SUBSCRIPTION ... DISABLE``): ``airflow-repl pause``,
``airflow-repl resume``, the topology key ``paused`` and :func:`pause_subscription` /
:func:`resume_subscription`.

The distribution database records it in ``airflow_repl.subscriptions.paused``, beside the
subscription's status, which keeps its meaning: a paused subscription stays ``active`` (or
``pending``, ...).  So:

- the Distribution Agent skips it: a run for it records a history row with the outcome
  ``paused`` (:func:`paused_message`) without connecting to the subscriber, and a continuous run
  idles while it is paused; pausing waits for a batch being delivered to commit, and no batch
  starts after it;
- its commands stay in the distribution database: the cleanup keeps everything after its
  delivered position, and expires it after ``max_retention_hours`` without delivery like any
  idle subscription (then it must be reinitialized);
- the Snapshot Agent may (re)initialize it; it stays paused;
- resuming lets the next Distribution Agent run deliver the backlog, from the subscriber's
  watermark, exactly once.

Pausing a paused subscription, or resuming an active one, changes nothing and says so.
"""

from __future__ import annotations

import logging
import shlex
from typing import Any

from airflow_repl.engine.errors import NotInitialized, TopologyError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.state import dist_schema, dist_subscriptions

log = logging.getLogger(__name__)


def resume_command(publication: str, subscriber: str) -> str:
    """The command line that resumes the subscription (names quoted for a POSIX shell; TOPOLOGY stands
    for the topology file, which the engine does not know)."""
    return f"airflow-repl resume -t TOPOLOGY -p {shlex.quote(publication)} --subscriber {shlex.quote(subscriber)}"


def paused_message(publication: str, subscriber: str, delivered: int = 0) -> str:
    """What a Distribution Agent run says of a paused subscription: its name, what the run
    ``delivered`` before it found it paused, and how to resume it."""
    done = f"{delivered} transaction(s) delivered before the pause" if delivered else "nothing was delivered"
    return (
        f"the subscription of subscriber {subscriber!r} to publication {publication!r} is paused: {done}; "
        f"its commands are kept (until max_retention_hours without delivery); resume it with: "
        f"{resume_command(publication, subscriber)}"
    )


def pause_subscription(topology: Topology, publication: str, subscriber: str) -> dict[str, Any]:
    """Pause the subscription of ``subscriber`` to ``publication``; returns ``{publication,
    subscriber, paused, changed, message}`` (``changed`` False: it was paused already).  An
    unknown or not applied subscription raises one line naming it; nothing changes then."""
    return _set(topology, publication, subscriber, True)


def resume_subscription(topology: Topology, publication: str, subscriber: str) -> dict[str, Any]:
    """Resume the subscription: the next Distribution Agent run delivers its backlog.  Returns
    as :func:`pause_subscription` (``changed`` False: it was not paused)."""
    return _set(topology, publication, subscriber, False)


def _require(topology: Topology, publication: str, subscriber: str) -> None:
    """The topology names the subscription (else one line naming it and those it has)."""
    topology.publication(publication)  # an unknown publication -> TopologyError naming it
    if any(s.subscriber == subscriber for s in topology.subscriptions_of(publication)):
        return
    names = ", ".join(repr(s.subscriber) for s in topology.subscriptions_of(publication)) or "none"
    raise TopologyError(
        f"no subscription of subscriber {subscriber!r} to publication {publication!r} in the topology: "
        f"name one of its subscribers ({names})"
    )


def _set(topology: Topology, publication: str, subscriber: str, paused: bool) -> dict[str, Any]:
    _require(topology, publication, subscriber)
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        dist_schema.ensure_schema(dist)
        if dist_subscriptions.subscription_paused(dist, publication, subscriber) is None:
            raise NotInitialized(
                f"the distribution database does not record the subscription of subscriber {subscriber!r} to "
                f"publication {publication!r}: run 'airflow-repl apply' with the topology first"
            )
        changed = dist_subscriptions.set_paused(dist, publication, subscriber, paused)
        dist.commit()
    name = f"the subscription of subscriber {subscriber!r} to publication {publication!r}"
    if paused:
        message = (
            f"{name} is paused: the Distribution Agent skips it; resume it with: "
            f"{resume_command(publication, subscriber)}"
            if changed
            else f"{name} was paused already: nothing changed"
        )
    else:
        message = (
            f"{name} is resumed: the next Distribution Agent run delivers its backlog"
            if changed
            else f"{name} was not paused: nothing changed"
        )
    log.info("%s", message)
    return {
        "publication": publication,
        "subscriber": subscriber,
        "paused": paused,
        "changed": changed,
        "message": message,
    }
