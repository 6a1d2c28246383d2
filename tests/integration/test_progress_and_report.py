"""Progress lines of long runs and ``airflow-repl report`` against real servers: a multi-batch
snapshot, read and delivery log their progress; the HTML report shows a realistic topology (runs,
a backlog, an error, a conflict) and renders in a headless browser (chromium)."""

from __future__ import annotations

import json
import logging
import re

import pytest
import yaml
from harness import CHROMIUM, chromium, orders_topology_file, setup_queued

from airflow_repl import cli
from airflow_repl.engine.agents import (
    distribution_agent,
    log_reader_agent,
    queue_reader_agent,
    snapshot_agent,
    snapshot_folder,
)
from airflow_repl.engine.errors import NotInitialized, ReplError
from airflow_repl.engine.runtime import progress_lines
from airflow_repl.presentation.status_rows import COLUMNS

LOGGER = "airflow_repl.engine.runtime.progress_lines"


def _lines(caplog, agent: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.getMessage().startswith(agent)]


def test_progress_lines_of_a_multi_batch_snapshot_read_and_delivery(env, spark, caplog, monkeypatch):
    monkeypatch.setenv(progress_lines.INTERVAL_VARIABLE, "0")  # a line after every batch
    monkeypatch.setattr(snapshot_folder, "ROWS_PER_PARTITION", 100)
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 400) g")
    topo = env.topology(["public.orders"], commit_batch_size=10)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=4)
    snap = _lines(caplog, "Snapshot Agent")
    copied, loaded = [line for line in snap if "copied" in line], [line for line in snap if "loaded" in line]
    assert copied[-1] == "Snapshot Agent for publication 'p': article 'orders': 400 of 400 rows copied (100%)"
    assert loaded[-1] == (
        "Snapshot Agent for publication 'p': article 'orders' at subscriber 'sub1': 400 of 400 rows loaded (100%)"
    )
    for found in (copied, loaded):  # per finished partition, growing
        counts = [int(re.search(r": (\d+) of 400 rows", line)[1]) for line in found]
        assert counts == sorted(set(counts)), found

    for i in range(30):  # 30 transactions of 2 commands
        env.run(env.pub, "UPDATE orders SET v = %s WHERE id IN (%s, %s)", (f"u{i}", 2 * i + 1, 2 * i + 2))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        read = log_reader_agent.run_log_reader(topo, "p", batch_changes=20)
    assert read["batches"] > 1
    lines = _lines(caplog, "Log Reader Agent")
    assert len(lines) == read["batches"], lines
    last = re.search(
        r"read (\d+) transactions, (\d+) commands in (\d+) batches; LSN (\S+) reached, WAL end (\S+)", lines[-1]
    )
    assert last and (int(last[1]), int(last[2]), int(last[3])) == (30, 60, read["batches"]), lines[-1]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        delivered = distribution_agent.run_distribution(topo, "p", "sub1")
    assert delivered["backlog_at_start"] == {"transactions": 30, "commands": 60}
    lines = _lines(caplog, "Distribution Agent")
    assert len(lines) == 3, lines  # batches of 10 transactions
    prefix = "Distribution Agent for publication 'p' to subscriber 'sub1': "
    assert lines[0] == prefix + "delivered 10 of 30 transactions (33%), 20 of 60 commands; 20 transactions pending"
    assert lines[-1] == prefix + "delivered 30 of 30 transactions (100%), 60 of 60 commands; 0 transactions pending"


def test_a_bad_progress_interval_is_refused_before_the_run(env, monkeypatch):
    monkeypatch.setenv(progress_lines.INTERVAL_VARIABLE, "soon")
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    topo = env.topology(["public.orders"])
    with pytest.raises(Exception, match="AIRFLOW_REPL_PROGRESS_INTERVAL='soon' is not a number of seconds"):
        log_reader_agent.run_log_reader(topo, "p")


# ---------------------------------------------------------------------- the HTML report
def _queued_topology_file(env, tmp_path) -> str:
    path = tmp_path / "topology.yaml"
    publication = {"name": "p", "articles": ["public.items"], "allow_queued_tran": True}
    subscriptions = [{"publication": "p", "subscriber": s, "update_mode": "queued tran"} for s in env.subs]
    path.write_text(yaml.safe_dump({**env.servers(), "publications": [publication], "subscriptions": subscriptions}))
    return str(path)


def _realistic_history(env, spark) -> None:
    """Runs of every agent, a conflict (sub1), a backlog of 6 transactions and an error (sub2),
    and a delivery to sub1 that succeeded but left a transaction pending (``until`` before it)."""
    topo = setup_queued(env, spark)
    env.run(env.subs["sub1"], "UPDATE items SET v = 'sub' WHERE id = 1")
    env.run(env.pub, "UPDATE items SET v = 'pub' WHERE id = 1")
    assert queue_reader_agent.run_queue_reader(topo, "p", "sub1")["conflicts"] == 1
    log_reader_agent.run_log_reader(topo, "p")
    for name in env.subs:
        distribution_agent.run_distribution(topo, "p", name)
    for i in range(5):
        env.run(env.pub, "UPDATE items SET n = n + 1 WHERE id <= %s", (i + 2,))
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")
    env.run(env.subs["sub2"], "DROP TABLE items")
    with pytest.raises(ReplError):
        distribution_agent.run_distribution(topo, "p", "sub2")
    before = env.rows(env.pub, "SELECT now()")[0][0]
    env.run(env.pub, "UPDATE items SET n = n + 1 WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    left = distribution_agent.run_distribution(topo, "p", "sub1", until=before)
    assert left["backlog_at_end"] == {"transactions": 1, "commands": 1} and left["transactions"] == 0


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/bootstrap.sh installs it)")
def test_report_renders_in_a_headless_browser(env2, spark, tmp_path, capsys):
    _realistic_history(env2, spark)
    topo = _queued_topology_file(env2, tmp_path)
    page = tmp_path / "report.html"
    capsys.readouterr()
    assert cli.main(["report", "-t", topo, "--file", str(page)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["report"] == str(page) and summary["subscriptions"] == 2 and summary["errors"] >= 1
    # -o json: the data the page shows, printed
    assert cli.main(["report", "-t", topo, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {s["subscriber"] for s in data["status"]} == {"sub1", "sub2"} and len(data["conflicts"]) == 1
    assert len(data["errors"]) == summary["errors"] and data["title"] == "topology.yaml"

    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", text) and "<script" not in text  # no network
    dom = chromium("--dump-dom", page.as_uri())
    assert "<svg" in dom and "Backlog now" in dom and "Throughput over time" in dom
    sub2_row = re.search(r"<tr><td>p</td><td>sub2</td>.*?</tr>", dom)
    assert sub2_row, dom
    cells = re.findall(r"<td[^>]*>(.*?)</td>", sub2_row[0])
    assert cells[3:5] == ["6", "21"] and cells[COLUMNS.index("distribution")].startswith(
        "failed"
    )  # backlog; the failed delivery
    assert "does not exist" in cells[COLUMNS.index("last error")]  # its last error
    assert "Conflicts (1)" in dom and "update/update" in dom
    assert re.search(r"<rect class=\"q\"[^>]*width=\"[1-9]", dom)  # a backlog bar drawn
    # throughput over time: a line per subscription, snapshot rows/s on a chart of its own
    delivered = re.search(
        r"<figcaption>Delivered commands per second, per subscription</figcaption>.*?</figure>", dom, re.S
    )
    assert delivered and "<polyline" in delivered[0] and "<title>p / sub1</title>" in delivered[0]
    assert re.search(r"<figcaption>Snapshot Agent: rows copied per second</figcaption><svg", dom)
    # the run that left a transaction pending is amber, not a clean success, in the chart and the table
    assert re.search(r"<circle class=\"warn\"[^>]*><title>run \d+ \(succeeded, 1 transactions left pending\)", dom)
    assert '<td class="warn">succeeded, 1 transactions left pending</td>' in dom

    shot = tmp_path / "report.png"
    chromium(f"--screenshot={shot}", "--window-size=1400,1500", page.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_report_refuses_a_missing_folder_and_an_undeployed_distributor(env, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    topo = orders_topology_file(env, tmp_path)
    assert cli.main(["report", "-t", topo, "--file", str(tmp_path / "nowhere" / "r.html")]) == ReplError.exit_code
    assert "folder" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()
    assert cli.main(["report", "-t", topo, "--file", str(tmp_path / "r.html")]) == NotInitialized.exit_code
    err = capsys.readouterr().err
    assert "has no airflow_repl tables yet: run 'airflow-repl apply'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()
