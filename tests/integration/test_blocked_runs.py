"""Nothing blocked is invisible: a Distribution Agent run refused by a check before it delivers
(articles changed since initialization, an expired subscription, a subscription not initialized)
or stopped by a subscriber it cannot reach leaves a history row (``blocked`` or ``failed``) and an
error row with the reason and the command that fixes it; ``status`` shows it and exits non-zero,
the report draws it as bad, in a headless browser."""

from __future__ import annotations

import json
import re

import pytest
from harness import CHROMIUM, chromium, every_subscriber_file, make_items, resolved_topology, to_uri

from airflow_repl import cli
from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import ConnectionFailed, NotInitialized, ReplError
from airflow_repl.presentation.status_rows import COLUMNS

RUN, ERROR = COLUMNS.index("distribution"), COLUMNS.index("last error")
REINITIALIZE = "airflow-repl snapshot -p p --subscriber sub1 --reinitialize"


_file = every_subscriber_file


def _last_distribution_run(env, subscriber: str = "sub1") -> tuple:
    return env.rows(
        env.dist,
        "SELECT status, message, finished_at IS NOT NULL FROM airflow_repl.agent_history "
        "WHERE agent = 'distribution' AND subscriber = %s ORDER BY run_id DESC LIMIT 1",
        (subscriber,),
    )[0]


def _status(topo_file: str, capsys) -> tuple[int, dict, str, str]:
    """``status`` as JSON (its code, sub1's record, its error line) and as the table."""
    capsys.readouterr()
    code = cli.main(["status", "-t", topo_file, "-o", "json"])
    out = capsys.readouterr()
    record = next(r for r in json.loads(out.out) if r["subscriber"] == "sub1")
    assert cli.main(["status", "-t", topo_file]) == code
    table = capsys.readouterr().out
    return code, record, out.err, table


def _shown(env, tmp_path, capsys, outcome: str) -> tuple[str, str]:
    """sub1's last Distribution Agent run has ``outcome`` and is finished; ``status`` shows it as
    its last run and its last error, and fails: the run's message and status's error line."""
    status, message, finished = _last_distribution_run(env)
    assert status == outcome and finished
    code, record, err, _ = _status(_file(env, tmp_path, ["public.items"]), capsys)
    assert code == ReplError.exit_code and record["last_runs"]["distribution"]["status"] == outcome
    assert record["last_error"]["message"] == message and message in " ".join(err.split())
    return message, err


def _changed_articles(env, spark, tmp_path) -> str:
    """sub1 initialized with ``items``, then its row filter changed: the Distribution Agent refuses."""
    make_items(env, 5)
    env.run(env.pub, "CREATE TABLE extra (id int PRIMARY KEY)")
    snapshot_agent.run_snapshot(env.topology(["public.items"]), "p", spark)
    bigger = env.topology([{"table": "public.items", "row_filter": "id <> 2"}, "public.extra"])
    with pytest.raises(ReplError, match="changed since"):  # the new articles stored, sub1 left as it is
        snapshot_agent.run_snapshot(bigger, "p", spark)
    with pytest.raises(ReplError, match="changed since subscriber 'sub1' was initialized.*" + re.escape(REINITIALIZE)):
        distribution_agent.run_distribution(bigger, "p", "sub1")
    return _file(env, tmp_path, [{"table": "public.items", "row_filter": "id <> 2"}, "public.extra"])


def test_changed_articles_leave_a_blocked_run_that_status_and_the_report_show(env, spark, tmp_path, capsys):
    topo_file = _changed_articles(env, spark, tmp_path)
    status, message, finished = _last_distribution_run(env)
    assert status == "blocked" and finished and REINITIALIZE in message
    assert env.rows(
        env.dist, "SELECT count(*) FROM airflow_repl.errors WHERE subscriber = 'sub1' AND message = %s", (message,)
    ) == [(1,)]

    code, record, err, table = _status(topo_file, capsys)
    assert code == ReplError.exit_code
    assert (
        record["last_runs"]["distribution"]["status"] == "blocked" and REINITIALIZE in record["last_error"]["message"]
    )
    assert "the Distribution Agent's last run was blocked" in err and REINITIALIZE in err
    assert re.search(r"\bsub1\b.*\bblocked 20\d\d-", table), table

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/bootstrap.sh installs it)")
    page = tmp_path / "report.html"
    assert cli.main(["report", "-t", topo_file, "--file", str(page)]) == 0
    dom = chromium("--dump-dom", page.as_uri())
    row = re.search(r"<tr><td>p</td><td>sub1</td>.*?</tr>", dom)
    assert row, dom
    cells = re.findall(r"<td( class=\"\w+\")?>(.*?)</td>", row[0])
    assert cells[RUN][0] == ' class="bad"' and cells[RUN][1].startswith("blocked ")  # the run, in red
    assert cells[ERROR][0] == ' class="bad"' and REINITIALIZE in cells[ERROR][1]  # the reason and its fix
    assert "<b>1</b>subscriptions whose last run failed or was blocked" in dom


def test_an_expired_subscription_leaves_a_blocked_run(env, spark, tmp_path, capsys):
    make_items(env, 5)
    topo = env.topology(["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.dist, "UPDATE airflow_repl.subscriptions SET status = 'expired' WHERE subscriber = 'sub1'")
    with pytest.raises(ReplError, match="expired"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    message, err = _shown(env, tmp_path, capsys, "blocked")
    assert "expired" in message and REINITIALIZE in message and "was blocked" in err


def test_a_subscription_not_initialized_leaves_a_blocked_run(env2, spark, tmp_path, capsys):
    make_items(env2, 5)
    topo = env2.topology(["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark, subscribers=["sub2"])
    with pytest.raises(NotInitialized):
        distribution_agent.run_distribution(topo, "p", "sub1")
    message, err = _shown(env2, tmp_path, capsys, "blocked")
    assert "Snapshot Agent" in message and "was blocked" in err


def test_an_unreachable_subscriber_leaves_a_failed_run(env, spark, tmp_path, capsys):
    make_items(env, 5)
    snapshot_agent.run_snapshot(env.topology(["public.items"]), "p", spark)
    servers = env.servers()
    servers["subscribers"]["sub1"] = re.sub(r":\d+/", ":1/", to_uri(env.sub))  # nothing listens on port 1
    gone = resolved_topology(
        {
            **servers,
            "publications": [{"name": "p", "articles": ["public.items"]}],
            "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
        }
    )
    with pytest.raises(ConnectionFailed):
        distribution_agent.run_distribution(gone, "p", "sub1")
    message, err = _shown(env, tmp_path, capsys, "failed")
    assert "cannot connect to the subscriber 'sub1'" in message and "the Distribution Agent's last run failed" in err


def test_a_lost_slot_leaves_a_blocked_log_reader_run(env, spark, tmp_path, capsys):
    make_items(env, 5)
    topo = env.topology(["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(
        env.pub,
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()",
    )
    with pytest.raises(NotInitialized, match="slot"):
        log_reader_agent.run_log_reader(topo, "p")
    status, message = env.rows(
        env.dist,
        "SELECT status, message FROM airflow_repl.agent_history WHERE agent = 'logreader' ORDER BY run_id DESC LIMIT 1",
    )[0]
    assert status == "blocked" and "reinitialize" in message
    code, record, err, table = _status(_file(env, tmp_path, ["public.items"]), capsys)
    assert code == ReplError.exit_code and "the Log Reader's last run was blocked" in err
    assert record["last_runs"]["logreader"]["status"] == "blocked" and re.search(r"\bblocked 20\d\d-", table)


def test_a_refusal_after_the_run_began_is_blocked_not_failed(env, spark):
    """The Snapshot Agent checks the subscribers' types after its history row is started: a
    subscriber whose enum differs refuses the snapshot, and the run is recorded ``blocked``
    with the reason (a refusal to act on), like a refusal before the row, not ``failed``."""
    env.run(env.pub, "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy'); CREATE TABLE t (id int PRIMARY KEY, m mood)")
    env.run(env.sub, "CREATE TYPE mood AS ENUM ('sad', 'ok')")
    with pytest.raises(ReplError, match=r"enum public\.mood differs"):
        snapshot_agent.run_snapshot(env.topology(["public.t"]), "p", spark)
    status, message, finished = env.rows(
        env.dist,
        "SELECT status, message, finished_at IS NOT NULL FROM airflow_repl.agent_history "
        "WHERE agent = 'snapshot' ORDER BY run_id DESC LIMIT 1",
    )[0]
    assert (status, finished) == ("blocked", True) and "enum public.mood differs" in message
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.errors WHERE message = %s", (message,)) == [(1,)]
