"""The PySpark application behind every agent.

``spark-submit agent_job.py <agent> --spec FILE --result FILE [options]``

``--spec`` names a JSON file (mode 0600, written by the operator or CLI) holding the topology
with resolved connection strings, so that no password ever appears on the spark-submit command
line.  The job deletes the file as soon as it has read it.  ``--result`` receives the run's
summary as JSON (the operators push it to XCom).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from airflow_repl.engine import distribution, logreader, snapshot
from airflow_repl.engine.topology import Topology, from_dict

AGENTS = ("snapshot", "logreader", "distribution")
log = logging.getLogger("airflow_repl.job")


def _deliver_one(spec: dict, publication: str, subscriber: str, until: str | None) -> dict:
    """Executor side: one subscription's delivery (several run in parallel as Spark tasks)."""
    topo = from_dict(spec)
    return {"subscriber": subscriber, **distribution.run_distribution(topo, publication, subscriber, until=until)}


def run_agent(agent: str, topo: Topology, publication: str, *, subscribers: list[str] | None = None,
              until: str | None = None, reinitialize: bool = False, spark=None) -> dict:
    """Run one agent; the same entry point serves spark-submit, the CLI and the tests."""
    from airflow_repl.jobs.session import spark_session

    topo.publication(publication)  # unknown publication -> clear error
    if agent == "snapshot":
        spark = spark or spark_session(f"airflow-repl-snapshot-{publication}")
        result = snapshot.run_snapshot(topo, publication, spark, subscribers=subscribers,
                                       reinitialize=reinitialize)
    elif agent == "logreader":
        result = logreader.run_log_reader(topo, publication)
    elif agent == "distribution":
        names = subscribers or [s.subscriber for s in topo.subscriptions_of(publication)]
        if len(names) <= 1:
            results = [{"subscriber": n, **distribution.run_distribution(topo, publication, n, until=until)}
                       for n in names]
        else:
            spark = spark or spark_session(f"airflow-repl-distribution-{publication}")
            spec = topo.to_dict(with_secrets=True)
            results = spark.sparkContext.parallelize(names, len(names)).map(
                lambda n: _deliver_one(spec, publication, n, until)).collect()
        result = {"subscriptions": results,
                  "transactions": sum(r["transactions"] for r in results),
                  "commands": sum(r["commands"] for r in results)}
    else:
        raise ValueError(f"unknown agent {agent!r}; choose one of {', '.join(AGENTS)}")
    if spark is not None:
        result["spark_application_id"] = spark.sparkContext.applicationId
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent_job.py")
    parser.add_argument("agent", choices=AGENTS)
    parser.add_argument("--spec", required=True, help="JSON file with the resolved topology")
    parser.add_argument("--result", help="where to write the run summary (JSON)")
    parser.add_argument("--publication", required=True)
    parser.add_argument("--subscriber", action="append", help="limit to these subscribers")
    parser.add_argument("--until", help="deliver transactions committed up to this ISO-8601 time")
    parser.add_argument("--reinitialize", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec_path = Path(args.spec)
    spec = json.loads(spec_path.read_text())
    try:
        spec_path.unlink()
    except OSError:
        pass
    topo = from_dict(spec)
    result = run_agent(args.agent, topo, args.publication, subscribers=args.subscriber,
                       until=args.until or None, reinitialize=args.reinitialize)
    log.info("%s agent finished: %s", args.agent, json.dumps(result, default=str))
    if args.result:
        tmp = Path(args.result + ".tmp")
        tmp.write_text(json.dumps(result, default=str))
        os.replace(tmp, args.result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
