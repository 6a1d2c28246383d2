"""The cleanup agent (SQL Server's distribution clean-up): expires subscriptions idle past the
maximum retention, then deletes from the distribution database the transactions and commands
of a publication that every subscription has and that are older than the minimum retention.

Safety:

* what a subscription still needs is never deleted (the rule is
  :mod:`~airflow_repl.engine.state.retention`'s); the run holds the Snapshot Agent's lock, so
  no subscription is being initialized meanwhile;
* a subscription is expired only while no Distribution Agent delivers a batch to it (the agent
  holds its row), and an expired one is refused by the Distribution Agent until the Snapshot
  Agent reinitializes it;
* deletion goes in commit order, in batches of at most ``batch_commands`` commands, each in its
  own distributor transaction that also records how far it got: a killed run loses nothing and
  the next run continues (a transaction larger than a batch is deleted over several).

History tables (``agent_history``, ``errors``, ``conflicts``) are not touched.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_repl.engine.errors import AgentBusy, ReplError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.runtime.lifecycle import AgentRun
from airflow_repl.engine.state import dist_publications, retention
from airflow_repl.engine.state.retention import Candidate

log = logging.getLogger(__name__)
AGENT = "cleanup"


@dataclass(frozen=True)
class Retention:
    """The retention a cleanup run applies, in hours."""

    min_hours: float
    max_hours: float


def retention_settings(
    topology: Topology, publication: str, min_hours: float | None = None, max_hours: float | None = None
) -> Retention:
    """The caller's retention over the publication's (``min_retention_hours`` /
    ``max_retention_hours``), checked: an unknown publication or a bad value raises."""
    pub = topology.publication(publication)
    low = pub.min_retention_hours if min_hours is None else min_hours
    high = pub.max_retention_hours if max_hours is None else max_hours
    for name, value in (("minimum", low), ("maximum", high)):
        if isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ReplError(f"the {name} retention {value!r} is not a number of hours >= 0: give e.g. 0, 24 or 72")
    if high == 0:
        raise ReplError("the maximum retention is 0 hours: give a number of hours > 0 (default 72)")
    if low > high:
        raise ReplError(
            f"the minimum retention ({low} h) is above the maximum retention ({high} h) for publication "
            f"{publication!r}: make the minimum at most the maximum"
        )
    return Retention(float(low), float(high))


def deletable_prefix(rows: list[Candidate], max_commands: int) -> list[Candidate]:
    """The leading deletable transactions, within about ``max_commands`` commands (at least one:
    a larger transaction is deleted over several batches)."""
    out: list[Candidate] = []
    total = 0
    for row in rows:
        if not row.deletable or (out and total + row.command_count > max_commands):
            break
        out.append(row)
        total += row.command_count
    return out


class _Cleanup:
    """One run: its connection, settings and totals."""

    def __init__(self, run: AgentRun, topology: Topology, publication: str, settings: Retention) -> None:
        self.run, self.publication, self.settings = run, publication, settings
        run.step = "connecting"
        self.dist = run.connect(topology.distributor.require("distributor"), "distributor")
        self.totals: dict[str, Any] = {
            "transactions_deleted": 0,
            "commands_deleted": 0,
            "origin_transactions_kept": 0,
            "batches": 0,
            "expired": [],
            "min_retention_hours": settings.min_hours,
            "max_retention_hours": settings.max_hours,
        }

    def lock(self) -> None:
        """This agent's lock, and the Snapshot Agent's (no subscription initialized meanwhile)."""
        self.run.lock(self.dist)
        try:
            self.run.lock(self.dist, of="snapshot")
        except AgentBusy:
            raise AgentBusy(
                f"the Snapshot Agent is running for publication {self.publication!r}; run the cleanup "
                f"again when it has finished"
            ) from None

    def check(self) -> None:
        """The publication is deployed (nothing is changed)."""
        self.run.step = "the publication check"
        dist_publications.slot_name(self.dist, self.publication)
        self.dist.commit()

    def expire(self) -> None:
        """Expire the subscriptions idle past the maximum retention (one transaction)."""
        self.run.step = "expiring subscriptions"
        expired = retention.expire_subscriptions(self.dist, self.publication, timedelta(hours=self.settings.max_hours))
        self.dist.commit()
        for e in expired:
            log.warning(
                "subscription of subscriber %r to publication %r%s expired: last synchronized %s, a transaction "
                "waiting since %s, maximum retention %s h; reinitialize it (Snapshot Agent with reinitialize)",
                e.subscriber,
                self.publication,
                " (paused)" if e.paused else "",
                e.last_sync,
                e.waiting_since,
                self.settings.max_hours,
            )
            self.totals["expired"].append(e.subscriber)
        if expired:
            self.totals["messages"] = [
                retention.expired_message(self.publication, e.subscriber, e.paused) for e in expired
            ]

    def delete_batch(self, max_transactions: int, max_commands: int) -> bool:
        """Delete the next batch; False when nothing more may be deleted."""
        self.run.step = f"cleaning up batch {self.totals['batches'] + 1}"
        held = retention.hold(self.dist, self.publication)
        self.totals["held_by"] = held.held_by
        after = retention.cleaned_position(self.dist, self.publication)
        rows = retention.candidates(
            self.dist, self.publication, after, held, timedelta(hours=self.settings.min_hours), max_transactions
        )
        batch = deletable_prefix(rows, max_commands)
        if not batch:
            self.dist.rollback()
            return False
        first, last = batch[0].xact, batch[-1].xact
        while (n := retention.delete_commands(self.dist, self.publication, first, last, max_commands)) >= max_commands:
            self.dist.commit()  # a transaction larger than a batch: its commands over several commits
            self.totals["commands_deleted"] += n
        deleted, kept = retention.delete_transactions(self.dist, self.publication, first, last)
        self.dist.commit()
        self.totals["commands_deleted"] += n
        self.totals["transactions_deleted"] += deleted
        self.totals["origin_transactions_kept"] += kept
        self.totals["batches"] += 1
        self.totals["cleaned_through"] = last
        return True


def run_cleanup(
    topology: Topology,
    publication: str,
    *,
    min_retention_hours: float | None = None,
    max_retention_hours: float | None = None,
    batch_transactions: int = 1000,
    batch_commands: int = 10000,
    max_batches: int | None = None,
) -> dict[str, Any]:
    """Expire idle subscriptions, then delete what every subscription has, in batches (all of
    it, or ``max_batches``).  Returns a summary (transactions_deleted, commands_deleted,
    expired, held_by, batches, seconds)."""
    settings = retention_settings(topology, publication, min_retention_hours, max_retention_hours)
    if batch_transactions < 1 or batch_commands < 1:
        raise ReplError("the cleanup's batch sizes must be at least 1")
    with AgentRun(AGENT, publication) as run:
        cleanup = _Cleanup(run, topology, publication, settings)
        cleanup.lock()
        cleanup.check()
        run.begin(cleanup.dist)
        run.counts = totals = cleanup.totals
        cleanup.expire()
        while max_batches is None or totals["batches"] < max_batches:
            if not cleanup.delete_batch(batch_transactions, batch_commands):
                break
        return run.succeed(totals, transactions=totals["transactions_deleted"], commands=totals["commands_deleted"])
