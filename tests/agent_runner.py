"""Runs one agent in its own process, so that tests can kill it at an arbitrary moment.

usage: python agent_runner.py <logreader|distribution> SPEC_JSON [KWARGS_JSON]
"""

import json
import sys
from pathlib import Path

from airflow_repl.engine import distribution, logreader
from airflow_repl.engine.topology import from_dict

agent, spec = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
kwargs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
topo = from_dict(spec)
if agent == "logreader":
    logreader.run_log_reader(topo, "p", **kwargs)
else:
    distribution.run_distribution(topo, "p", "sub1", **kwargs)
