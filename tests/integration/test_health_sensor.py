"""ReplicationHealthSensor on real servers, poking and deferred: it succeeds when the
subscriptions are caught up, keeps waiting at a warning (and times out with the breach line), and
fails at once, not retried, at a critical one (critical latency, a blocked last run); its
trigger, rebuilt from its serialized form (no secret in it), fires each event."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, TaskDeferred
from harness import assert_no_secret, first_event, items_topology_file, setup_items

from airflow_repl.engine.agents import distribution_agent, log_reader_agent
from airflow_repl.engine.errors import ReplError
from airflow_repl.sensors.health import ReplicationHealthSensor
from airflow_repl.triggers.health import ReplicationHealthTrigger

WARNING = "WARNING: subscriber 'sub1' of publication 'p': 2 commands pending, at or above warn_pending_commands 2"


def _thresholds(env, tmp_path, **keys) -> str:
    path = tmp_path / "thresholds.yaml"
    data = yaml.safe_load(Path(items_topology_file(env, tmp_path)).read_text())
    data["publications"][0].update(keys)
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _sensor(path: str, **kwargs) -> ReplicationHealthSensor:
    return ReplicationHealthSensor(task_id="healthy", topology=path, publication="p", poke_interval=0.2, **kwargs)


def test_passes_when_caught_up_and_waits_at_a_warning_until_delivered(env, spark, tmp_path):
    topo = setup_items(env, spark, 10)
    path = _thresholds(env, tmp_path, warn_pending_commands=2, critical_latency_seconds=3600)
    sensor = _sensor(path)
    assert sensor.poke({}) is True and sensor.last_status.message == (
        "OK: 1 subscription(s) of publication 'p' within their thresholds"
    )
    assert sensor.execute({}) is None  # poke mode: done at the first poke

    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id = 1")  # 1 command pending: below the threshold
    log_reader_agent.run_log_reader(topo, "p")
    assert sensor.poke({}) is True
    env.run(env.pub, "UPDATE items SET v = 'y' WHERE id = 2")  # 2 pending: at the threshold, a warning
    log_reader_agent.run_log_reader(topo, "p")
    assert sensor.poke({}) is False and sensor.last_status.message == WARNING
    with pytest.raises(AirflowSensorTimeout, match=WARNING):  # a warning waits until the timeout
        _sensor(path, timeout=0).execute({})

    deferring = _sensor(path, deferrable=True, timeout=60)
    with pytest.raises(TaskDeferred) as deferred:
        deferring.execute({})
    trigger = deferred.value.trigger
    classpath, kwargs = assert_no_secret(trigger, env)
    assert classpath == "airflow_repl.triggers.health.ReplicationHealthTrigger"
    assert set(kwargs) == {"topology_path", "publication", "subscribers", "poll_interval", "end_time"}
    event = first_event(ReplicationHealthTrigger(**{**kwargs, "end_time": time.time() - 1}))
    assert event == {"status": "timeout", "message": WARNING, "position": None}
    with pytest.raises(AirflowSensorTimeout, match=WARNING):
        deferring.execute_complete({}, event)

    distribution_agent.run_distribution(topo, "p", "sub1")
    event = first_event(ReplicationHealthTrigger(**kwargs))
    assert event["status"] == "success" and event["message"].startswith("OK: 1 subscription(s)")
    assert deferring.execute_complete({}, event) is None
    assert sensor.poke({}) is True


def test_critical_latency_fails_at_once_poking_and_deferred(env, spark, tmp_path):
    topo = setup_items(env, spark, 10)
    path = _thresholds(env, tmp_path, warn_latency_seconds=0.5, critical_latency_seconds=1)
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    time.sleep(1.1)
    critical = r"CRITICAL: subscriber 'sub1' of publication 'p': lag [\d.]+s, at or above critical_latency_seconds 1"
    with pytest.raises(AirflowFailException, match=critical):  # not retried, not waited out
        _sensor(path, timeout=60).execute({})
    trigger = ReplicationHealthTrigger(topology_path=path, publication="p", poll_interval=0.1)
    event = first_event(trigger)
    assert event["status"] == "failed" and "at or above critical_latency_seconds 1" in event["message"]
    with pytest.raises(AirflowFailException, match=critical):
        _sensor(path, deferrable=True).execute_complete({}, event)


def test_a_blocked_run_fails_the_sensor_with_its_fix(env, spark, tmp_path):
    topo = setup_items(env, spark, 10)
    path = _thresholds(env, tmp_path)  # no threshold: only the last runs count
    env.run(env.dist, "UPDATE airflow_repl.subscriptions SET status = 'expired' WHERE subscriber = 'sub1'")
    with pytest.raises(ReplError, match="expired"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    with pytest.raises(AirflowFailException) as failed:
        _sensor(path).poke({})
    assert "CRITICAL: 'sub1' of publication 'p': the Distribution Agent's last run was blocked" in str(failed.value)
    assert "airflow-repl snapshot -p p --subscriber sub1 --reinitialize" in str(failed.value)


def test_nothing_to_check_fails_in_one_line(env, spark, tmp_path):
    setup_items(env, spark, 10)
    path = items_topology_file(env, tmp_path)
    with pytest.raises(AirflowFailException) as failed:
        _sensor(path, subscribers=["nobody"]).poke({})
    assert str(failed.value) == (
        "healthy failed: no subscription of subscriber(s) 'nobody' to publication 'p' in the distribution database "
        "to check: apply the topology and run the Snapshot Agent first, or name a subscriber of the publication"
    )
    event = first_event(ReplicationHealthTrigger(topology_path=path, publication="p", subscribers=["nobody"]))
    assert event["status"] == "error" and "no subscription of subscriber(s) 'nobody'" in event["message"]
