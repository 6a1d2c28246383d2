"""``airflow-repl status`` against real servers: backlog, watermark, last runs, errors, exit codes."""

from __future__ import annotations

import json

from harness import orders_topology_file

from airflow_repl import cli
from airflow_repl.engine.errors import ReplError


def _status(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["status", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_backlog_delivery_failure_and_max_pending(env, spark, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text); INSERT INTO orders VALUES (1, 'a'), (2, 'b')")
    topo = orders_topology_file(env, tmp_path)
    assert cli.main(["apply", "-t", topo]) == 0
    assert cli.main(["snapshot", "-t", topo]) == 0
    env.run(env.pub, "UPDATE orders SET v = 'c' WHERE id = 1")
    env.run(env.pub, "UPDATE orders SET v = 'd' WHERE id = 2")
    assert cli.main(["logreader", "-t", topo]) == 0
    capsys.readouterr()

    code, out, _ = _status(capsys, "-t", topo, "-o", "json")
    assert code == 0
    [row] = json.loads(out)
    assert (row["publication"], row["subscriber"], row["status"]) == ("p", "sub1", "active")
    assert row["backlog"] == {"transactions": 2, "commands": 2}
    assert row["last_runs"]["logreader"]["status"] == "succeeded" and row["last_runs"]["distribution"] is None
    assert row["expires_at"] is not None

    code, _, err = _status(capsys, "-t", topo, "--max-pending", "1")
    assert code == ReplError.exit_code and "2 transactions pending, above --max-pending 1" in err
    assert len(err.strip().splitlines()) == 1

    assert cli.main(["distribution", "-t", topo]) == 0
    capsys.readouterr()
    code, out, _ = _status(capsys, "-t", topo, "-o", "json", "--max-pending", "0")
    [row] = json.loads(out)
    assert code == 0 and row["backlog"] == {"transactions": 0, "commands": 0} and row["expires_at"] is None
    assert row["delivered"]["xact_seqno"] and row["delivered"]["commit_time"]
    assert row["last_runs"]["distribution"]["status"] == "succeeded"

    env.run(env.sub, "DROP TABLE orders")
    env.run(env.pub, "UPDATE orders SET v = 'e' WHERE id = 1")
    assert cli.main(["logreader", "-t", topo]) == 0
    assert cli.main(["distribution", "-t", topo]) != 0
    capsys.readouterr()
    code, out, err = _status(capsys, "-t", topo, "-o", "json")
    [row] = json.loads(out)
    assert code == ReplError.exit_code and "Distribution Agent's last run failed" in err and "'sub1'" in err
    assert row["last_runs"]["distribution"]["status"] == "failed" and row["last_error"]["message"]

    code, out, _ = _status(capsys, "-t", topo)
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["publication", "subscriber", "status"] and len(lines) == 2
    assert lines[1].split()[:3] == ["p", "sub1", "active"]
