"""Every agent, registered once: its name, its label, whether it runs continuously, whether a
run is one per subscriber, and which other agent takes the same lock.

The run lifecycle's labels and busy messages, continuous mode's agents, the Spark job's
per-subscriber runs, the CLI's agent commands and the operators' ``agent`` names all come from
:data:`AGENTS`.  A new agent is an entry here, its module in :mod:`airflow_repl.engine.agents`
and its entry in ``airflow_repl.jobs.agent_job``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Agent:
    """One agent, as every layer names it."""

    #: the name runs are recorded under, and the CLI's and spark-submit's command
    name: str
    #: the name people read: "Distribution Agent"
    label: str
    #: whether it has continuous mode (``--continuous``)
    continuous: bool = False
    #: whether one run serves each subscriber on its own (in parallel on Spark when there are several)
    per_subscriber: bool = False
    #: the totals a run over several subscribers adds up (per-subscriber agents)
    counted: tuple[str, ...] = ()
    #: what a run over several subscribers does, for the refusal of continuous runs with too few task slots
    work: str = ""
    #: another agent that takes this agent's lock while it runs (its busy message says so)
    shares_lock_with: str | None = None


AGENTS: dict[str, Agent] = {
    agent.name: agent
    for agent in (
        Agent("snapshot", "Snapshot Agent", shares_lock_with="cleanup"),
        Agent("logreader", "Log Reader Agent", continuous=True),
        Agent(
            "distribution",
            "Distribution Agent",
            continuous=True,
            per_subscriber=True,
            counted=("transactions", "commands"),
            work="delivery of publication {publication!r} to",
        ),
        Agent(
            "queuereader",
            "Queue Reader Agent",
            continuous=True,
            per_subscriber=True,
            counted=("transactions", "commands", "conflicts"),
            work="reading of the queues of publication {publication!r} at",
        ),
        Agent("cleanup", "Cleanup Agent"),
    )
}

#: The agents with a continuous mode, in the registry's order.
CONTINUOUS = tuple(name for name, agent in AGENTS.items() if agent.continuous)


def label(name: str) -> str:
    """``name``'s label ("Distribution Agent"); any other name as it is."""
    agent = AGENTS.get(name)
    return agent.label if agent else name


def lock_note(name: str) -> str:
    """What ``name``'s busy message adds about another agent taking the same lock."""
    agent = AGENTS.get(name)
    if agent is None or agent.shares_lock_with is None:
        return ""
    return f" (the {label(agent.shares_lock_with)} holds this lock too while it runs)"
