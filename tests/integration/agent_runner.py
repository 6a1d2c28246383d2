"""Runs one agent in its own process, so that tests can kill it at an arbitrary moment.  It
prints and exits like the command line: the summary as JSON and exit 0, or one
``airflow-repl: error: ...`` line and the error class's exit code.

usage: python agent_runner.py <logreader|distribution|queuereader> SPEC_JSON [KWARGS_JSON]

KWARGS_JSON may name the ``subscriber`` (default sub1) of the Distribution Agent or the Queue
Reader; the rest are the agent's keyword arguments.
"""

import json
import sys
from pathlib import Path

from airflow_repl.cli import report_error
from airflow_repl.engine.agents import distribution_agent, log_reader_agent, queue_reader_agent
from airflow_repl.engine.model.topology import from_dict


def main() -> int:
    agent, spec = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    kwargs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    subscriber = kwargs.pop("subscriber", "sub1")
    topo = from_dict(spec)
    try:
        if agent == "logreader":
            result = log_reader_agent.run_log_reader(topo, "p", **kwargs)
        elif agent == "queuereader":
            result = queue_reader_agent.run_queue_reader(topo, "p", subscriber, **kwargs)
        else:
            result = distribution_agent.run_distribution(topo, "p", subscriber, **kwargs)
    except Exception as exc:
        return report_error(exc)
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
