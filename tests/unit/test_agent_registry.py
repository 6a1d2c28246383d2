"""Each agent is registered once (engine/runtime/registry.py) and every other list of agents
comes from that registry: the lifecycle's labels and busy messages, continuous mode, the CLI's
agent commands, the Spark job's table and the operators' names."""

from __future__ import annotations

import pytest

from airflow_repl import cli
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.runtime import continuous, registry
from airflow_repl.engine.runtime.lifecycle import AgentRun
from airflow_repl.jobs import agent_job
from airflow_repl.operators import agents as agent_operators


def test_labels_and_lock_notes_come_from_the_registry():
    assert registry.label("distribution") == "Distribution Agent"
    assert registry.label("validate") == "validate"  # not an agent: its own name
    assert registry.lock_note("snapshot") == " (the Cleanup Agent holds this lock too while it runs)"
    assert registry.lock_note("distribution") == ""
    assert AgentRun("queuereader", "p", "s").label == "Queue Reader Agent"


def test_continuous_mode_serves_exactly_the_registered_continuous_agents():
    assert continuous.AGENTS == ("logreader", "distribution", "queuereader")
    with pytest.raises(ReplError, match="only logreader, distribution and queuereader run continuously"):
        continuous.check_request("snapshot", None, {"continuous": True})


def test_the_cli_has_a_command_per_agent_and_continuous_options_where_registered():
    parser = cli.build_parser()
    for name, agent in registry.AGENTS.items():
        args = parser.parse_args([name, "-t", "t.yaml"])
        assert args.command == name
        assert hasattr(args, "continuous") == agent.continuous, name


def test_the_job_and_the_operators_run_only_registered_agents():
    assert set(registry.AGENTS) - {"cleanup"} <= set(agent_job.AGENTS)  # cleanup runs without Spark
    operator_agents = {
        cls.agent for cls in vars(agent_operators).values() if isinstance(cls, type) and getattr(cls, "agent", "")
    }
    assert operator_agents == {"snapshot", "logreader", "distribution", "queuereader"}
    assert operator_agents <= set(registry.AGENTS)


def test_per_subscriber_agents_name_their_totals_and_their_work():
    per_subscriber = {n for n, a in registry.AGENTS.items() if a.per_subscriber}
    assert per_subscriber == {"distribution", "queuereader"}
    for name in per_subscriber:
        agent = registry.AGENTS[name]
        assert agent.counted[:2] == ("transactions", "commands")
        assert "{publication!r}" in agent.work
