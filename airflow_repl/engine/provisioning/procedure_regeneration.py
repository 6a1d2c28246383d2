"""Regenerating the procedures of a publication's articles at subscribers on demand
(``airflow-repl regenerate-procs``, the RegenerateProceduresOperator).

Each subscriber is done in one transaction of its own: the generated procedures of each
article are dropped and created again for the definitions that subscriber has (those at its
watermark), and an article's registered script regenerates its custom procedures.  A
subscriber that fails is rolled back and named; the others are done all the same.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_repl.engine.errors import DeliveryError, TopologyError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.state import dist_publications, subscriber_state
from airflow_repl.engine.subscriber import schema_changes

log = logging.getLogger(__name__)


def regenerate_procedures(
    topology: Topology, publication: str, *, subscribers: list[str] | None = None, articles: list[str] | None = None
) -> dict[str, Any]:
    """Regenerate at each subscriber (default: every subscriber of the publication); returns
    subscriber -> the articles done, and raises, after trying every subscriber, when one failed."""
    names = subscribers or [s.subscriber for s in topology.subscriptions_of(publication)]
    for name in names:
        topology.subscription(publication, name)
    wanted = set(articles or [])
    unknown = wanted - {a.name for a in topology.publication(publication).articles}
    if unknown:
        raise TopologyError(f"publication {publication!r} has no article(s) {sorted(unknown)}")
    done: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name in names:
        try:
            done[name] = _one(topology, publication, name, wanted)
        except Exception as exc:
            failed[name] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("regenerating procedures at subscriber %r failed: %s", name, failed[name])
    if failed:
        raise DeliveryError(
            "regenerating procedures failed at "
            + "; ".join(f"subscriber {s!r}: {m}" for s, m in failed.items())
            + (f" (done at {sorted(done)})" if done else "")
        )
    return {"publication": publication, "subscribers": done}


def _one(topology: Topology, publication: str, subscriber: str, wanted: set[str]) -> list[str]:
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        stored = dist_publications.load_articles(dist, publication)
        scripts = dist_publications.custom_scripts(dist, publication)
        conninfo = topology.subscriber_conninfo(subscriber)
        with connections.connect(conninfo, f"subscriber {subscriber!r}") as sub:
            watermark = subscriber_state.watermark(sub, publication)
            has = dist_publications.definitions_at(dist, publication, watermark, stored)
            ctx = schema_changes.SchemaContext(subscriber, scripts)
            chosen = [a for a in has if not wanted or a.name in wanted]
            with sub.transaction():
                for art in chosen:
                    schema_changes.regenerate(sub, art, art, ctx)
    return [a.name for a in chosen]
