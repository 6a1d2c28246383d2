"""``airflow-repl plan`` and ``apply``: what applying the topology file would change, computed
from the servers without changing them, then carried out exactly.

:func:`plan` compares the file with what is deployed (the publications and their updating
options, the articles with their definitions: table, columns, row filter, propagation,
procedures; the subscriptions with their options, update mode and ``paused``) and returns a
:class:`Plan`: one :class:`Action` per thing to create, alter or drop, and a ``reinitialize``
action for each initialized subscription whose articles would change (its Distribution Agent
refuses until the Snapshot Agent reinitializes it, which copies every article again), and a
``copy`` action for each article an initialized subscription does not hold yet (an article
added to the live publication: the next Snapshot Agent run copies it alone).

:func:`apply` carries out a plan: the drops (refused, before anything changes, unless
``allow_drop``) through :mod:`~airflow_repl.engine.provisioning.drop`, then the rest through
:func:`~airflow_repl.engine.provisioning.deploy.apply_topology`.  Reinitializing is the
Snapshot Agent's work: apply lists it, the next ``snapshot --reinitialize`` does it.

Nothing is changed by :func:`plan`: it reads the distribution database and the publisher's
catalog; row filters are deparsed by PostgreSQL in a transaction that is always rolled back.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.provisioning import deploy, drop, updating_setup
from airflow_repl.engine.state import dist_publications, dist_schema, dist_subscription_articles, dist_subscriptions

log = logging.getLogger(__name__)

#: The kinds of action, in the order apply carries them out.
KINDS = ("drop", "create", "alter", "copy", "reinitialize")


@dataclass(frozen=True)
class Action:
    """One change applying the topology makes (or, for ``reinitialize``, needs)."""

    kind: str  # create, alter, drop, copy, reinitialize
    object: str  # publication, article, subscription
    publication: str
    name: str  # the publication's, the article's or the subscriber's name
    details: str = ""
    removes: bool = False  # drops something: refused unless allowed

    def line(self) -> str:
        """The action as one line of text."""
        what = (
            f"{self.object} {self.name!r}"
            if self.object == "publication"
            else f"{self.object} {self.name!r} of publication {self.publication!r}"
        )
        return f"{self.kind} {what}" + (f": {self.details}" if self.details else "")


@dataclass
class Plan:
    """The actions applying the topology takes, drops first."""

    actions: list[Action] = field(default_factory=list)

    @property
    def drops(self) -> list[Action]:
        return [a for a in self.actions if a.removes]

    def to_dict(self) -> dict[str, Any]:
        return {"actions": [asdict(a) for a in self.actions], "drops": len(self.drops)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        """One line per action, or a line saying there is nothing to do."""
        if not self.actions:
            return "nothing to do: the servers match the topology"
        return "\n".join(a.line() for a in self.actions)


# ---------------------------------------------------------------------- plan
def plan(topology: Topology, publications: list[str] | None = None) -> Plan:
    """What applying ``topology`` (or those of its ``publications``) would do; changes nothing.
    An unreachable server raises ConnectionFailed; a topology apply would refuse (a table
    missing at the publisher, a rejected row filter, ...) raises the same one-line error."""
    for name in publications or []:
        topology.publication(name)  # an unknown name: one line naming it
    deploy.check_reachable(topology)
    names = publications or list(topology.publications)
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        dist_schema.check_encoding(dist)
        deployed = dist_publications.deployed_publications(dist)
        updating_setup.refuse_turning_off(topology, dist_publications.recorded_updating_options(dist, names))
        dist.rollback()
        with connections.connect(topology.publisher.require("publisher"), "publisher") as pub:
            wanted = {name: _resolve(pub, topology, name) for name in names}
        actions: list[Action] = []
        if publications is None:
            for name in sorted(set(deployed) - set(names)):
                subs = [s.subscriber for s in dist_subscriptions.deployed_subscriptions(dist, name)]
                with_subs = f" with its subscriptions ({', '.join(repr(s) for s in subs)})" if subs else ""
                actions.append(
                    Action(
                        "drop",
                        "publication",
                        name,
                        name,
                        f"not in the topology file: its PostgreSQL publication, slot and rows go{with_subs}",
                        True,
                    )
                )
        for name in names:
            actions += _publication_actions(dist, topology, name, wanted[name], name in deployed)
        dist.rollback()
    order = {k: i for i, k in enumerate(KINDS)}
    return Plan(sorted(actions, key=lambda a: order[a.kind]))


def _resolve(pub: psycopg.Connection[Any], topology: Topology, name: str) -> list[ResolvedArticle]:
    """The publication's articles as apply would record them (row filters deparsed)."""
    publication = topology.publication(name)
    articles = deploy.resolve_publication(pub, publication)
    deploy.resolve_children(pub, publication, articles)
    updating_setup.check_publication(pub, publication, articles)
    deploy.deparse_row_filters(pub, publication, articles)
    pub.rollback()
    return articles


def _publication_actions(
    dist: psycopg.Connection[Any],
    topology: Topology,
    name: str,
    articles: list[ResolvedArticle],
    deployed: bool,
) -> list[Action]:
    publication = topology.publication(name)
    subs = topology.subscriptions_of(name)
    if not deployed:
        out = [Action("create", "publication", name, name, f"{len(articles)} article(s), its PostgreSQL publication")]
        out += [Action("create", "article", name, a.name, a.table.qualified) for a in articles]
        out += [
            Action("create", "subscription", name, s.subscriber, f"{s.update_mode}; the Snapshot Agent initializes it")
            for s in subs
        ]
        return out
    out = []
    recorded = dist_publications.recorded_updating_options(dist, [name]).get(name)
    wanted_options = updating_setup.updating_options(publication)
    if recorded is not None and recorded != wanted_options:
        out.append(Action("alter", "publication", name, name, _differences(asdict(recorded), asdict(wanted_options))))
    before = {a.name: a for a in dist_publications.load_articles(dist, name)}
    after = {a.name: a for a in articles}
    for art in articles:
        old = before.get(art.name)
        if old is None:
            out.append(Action("create", "article", name, art.name, art.table.qualified))
        elif old.to_dict() != art.to_dict():
            out.append(Action("alter", "article", name, art.name, _differences(old.to_dict(), art.to_dict())))
    out += [
        Action("drop", "article", name, n, "not in the topology file: its procedures and triggers go", True)
        for n in sorted(set(before) - set(after))
    ]
    kept = [before[n] for n in sorted(before) if n in after]  # what a drop of the others leaves
    return out + _subscription_actions(dist, topology, name, (list(before.values()), kept, articles))


def _subscription_actions(
    dist: psycopg.Connection[Any],
    topology: Topology,
    name: str,
    definitions: tuple[list[ResolvedArticle], list[ResolvedArticle], list[ResolvedArticle]],
) -> list[Action]:
    """The subscriptions' actions; ``definitions``: the articles recorded now, those of them
    the topology keeps, and the articles apply records."""
    out = []
    subs = topology.subscriptions_of(name)
    recorded = {s.subscriber: s for s in dist_subscriptions.deployed_subscriptions(dist, name)}
    settings = dist_subscriptions.subscription_settings(dist, name)
    for sub in subs:
        old = recorded.get(sub.subscriber)
        if old is None:
            initialize = f"{sub.update_mode}; the Snapshot Agent initializes it"
            out.append(Action("create", "subscription", name, sub.subscriber, initialize))
            continue
        options, mode, paused = settings[sub.subscriber]
        wanted_mode = str(sub.update_mode)
        if mode in dist_subscriptions.FAILOVER_MODES and wanted_mode in dist_subscriptions.FAILOVER_MODES:
            wanted_mode = mode  # set-update-mode's switch is kept
        diff = _differences(
            {"options": options, "update_mode": mode, **({"paused": paused} if sub.paused is not None else {})},
            {"options": sub.options(), "update_mode": wanted_mode, "paused": sub.paused},
        )
        if diff:
            out.append(Action("alter", "subscription", name, sub.subscriber, diff))
        reinitialize, lacking = _needs_reinitialize(dist, name, old, definitions)
        if not reinitialize:
            out += [
                Action(
                    "copy",
                    "article",
                    name,
                    article,
                    f"to subscriber {sub.subscriber!r}: the next Snapshot Agent run copies it alone, from a snapshot "
                    f"of its own; the other articles keep being delivered",
                )
                for article in lacking
            ]
        if reinitialize:
            command = (
                f"airflow-repl snapshot -t TOPOLOGY -p {shlex.quote(name)} --subscriber "
                f"{shlex.quote(sub.subscriber)} --reinitialize"
            )
            out.append(
                Action(
                    "reinitialize",
                    "subscription",
                    name,
                    sub.subscriber,
                    f"its articles change, so its Distribution Agent refuses until the Snapshot Agent copies "
                    f"every article again: after apply, run {command}",
                )
            )
    gone = "not in the topology file: what the product installed for it goes"
    out += [
        Action("drop", "subscription", name, s, gone, True)
        for s in sorted(set(recorded) - {s.subscriber for s in subs})
    ]
    return out


def _needs_reinitialize(
    dist: psycopg.Connection[Any],
    name: str,
    sub: dist_subscriptions.DeployedSubscription,
    definitions: tuple[list[ResolvedArticle], list[ResolvedArticle], list[ResolvedArticle]],
) -> tuple[bool, list[str]]:
    """Will the subscription's agents refuse it once applied (the article definitions it holds
    are not those recorded, but for the articles it does not hold yet; a dropped article's
    are rewritten by its drop)?  And the articles it does not hold yet (copied on their own)."""
    if sub.articles_hash is None:  # not initialized yet: the Snapshot Agent initializes it anyway
        return False, []
    held = dist_subscription_articles.held_articles(dist, name, sub.subscriber)
    before, _, after = definitions
    copied = dist_subscription_articles.held_names(held, "active") if held else {a.name for a in before}
    lacking = [a.name for a in after if a.name not in copied]
    hashes = [
        definition_hash(dist_publications.definitions_at(dist, name, sub.delivered, [a for a in d if a.name in copied]))
        for d in definitions
    ]
    has = hashes[1] if sub.articles_hash == hashes[0] else sub.articles_hash
    return has != hashes[2], lacking


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """``key: old -> new`` for each top-level key (and each key of a nested dict) that differs."""
    parts = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            parts += [
                f"{key}.{k}: {json.dumps(a.get(k), default=str)} -> {json.dumps(b.get(k), default=str)}"
                for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)
            ]
        else:
            parts.append(f"{key}: {json.dumps(a, default=str)} -> {json.dumps(b, default=str)}")
    return "; ".join(parts)


# ---------------------------------------------------------------------- apply
def apply(topology: Topology, publications: list[str] | None = None, *, allow_drop: bool = False) -> Plan:
    """Carry out the plan: refused before anything changes when it drops something and
    ``allow_drop`` is not given (one line listing the drops); else the drops (publications,
    then subscriptions, then articles), then the rest.  Returns the plan carried out."""
    the_plan = plan(topology, publications)
    drops = the_plan.drops
    if drops and not allow_drop:
        raise TopologyError(
            f"applying would drop {len(drops)} object(s): {'; '.join(a.line() for a in drops)}; nothing was changed: "
            f"apply with --allow-drop (allow_drop=True) to drop them, or put them back in the topology file"
        )
    for action in drops:
        if action.object == "publication":
            drop.drop_publication(topology, action.publication, with_subscriptions=True)
    for action in drops:
        if action.object == "subscription":
            drop.drop_subscription(topology, action.publication, action.name)
    for action in drops:
        if action.object == "article":
            drop.drop_article(topology, action.publication, action.name)
    deploy.apply_topology(topology, publications)
    for action in the_plan.actions:
        log.info("applied: %s", action.line())
    return the_plan
