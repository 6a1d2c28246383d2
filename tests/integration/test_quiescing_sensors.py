"""The quiescing sensors on real servers, in both modes: poke (``poke`` false, then true once the
agents ran) and deferred (``execute`` defers to a trigger holding no secret; the trigger's
``run()`` is driven to its event with asyncio; ``execute_complete``), the messages that name what
is behind and the agent to run, and what blocks quiescence: an unread change, an undelivered
transaction, a queued-updating queue not empty, an immediate-updating transaction in doubt."""

from __future__ import annotations

import importlib
import time

import pytest
import yaml
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout, TaskDeferred
from harness import assert_no_secret, first_event, items_topology_file, setup_immediate, setup_items, setup_queued

import airflow_repl
from airflow_repl.engine.agents import distribution_agent, log_reader_agent, queue_reader_agent
from airflow_repl.engine.monitoring import quiescing, tracer
from airflow_repl.engine.subscriber import in_doubt
from airflow_repl.operators.tracer import PostTracerTokenOperator
from airflow_repl.sensors.quiescing import TopologyQuiescedSensor, TracerTokenSensor
from airflow_repl.triggers.quiescing import TopologyQuiescedTrigger, TracerTokenTrigger


def cycle(topo, *subscribers):
    log_reader_agent.run_log_reader(topo, "p")
    for s in subscribers or ("sub1",):
        distribution_agent.run_distribution(topo, "p", s)


def written_topology(topo, tmp_path) -> str:
    """A topology object (with updating options) as a YAML file for the sensors."""
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo.to_dict(with_secrets=True)))
    return str(path)


# ---------------------------------------------------------------------- TracerTokenSensor
def test_tracer_token_sensor_pokes_false_then_true(env2, spark, tmp_path):
    topo = setup_items(env2, spark)
    path = items_topology_file(env2, tmp_path)
    token = tracer.post_tracer_token(topo, "p")
    sensor = TracerTokenSensor(task_id="wait", topology=path, publication="p", token_id=str(token))
    assert sensor.poke({}) is False and "run the Log Reader Agent" in sensor.last_status.message
    cycle(topo, "sub1")
    assert sensor.poke({}) is False
    message = sensor.last_status.message
    assert "subscriber 'sub2'" in message and "1 transaction(s) behind" in message
    assert "run the Distribution Agent for sub2" in message and "sub1" not in message.replace("sub1'", "")
    only_sub1 = TracerTokenSensor(task_id="w1", topology=path, publication="p", token_id=token, subscribers=["sub1"])
    assert only_sub1.poke({}) is True
    distribution_agent.run_distribution(topo, "p", "sub2")
    assert sensor.poke({}) is True


def test_tracer_token_sensor_defers_and_its_trigger_fires(env2, spark, tmp_path):
    topo = setup_items(env2, spark)
    path = items_topology_file(env2, tmp_path)
    token = tracer.post_tracer_token(topo, "p")
    sensor = TracerTokenSensor(
        task_id="wait", topology=path, publication="p", token_id=token, deferrable=True, poke_interval=0.2
    )
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert deferred.value.method_name == "execute_complete" and isinstance(trigger, TracerTokenTrigger)
    classpath, kwargs = assert_no_secret(trigger, env2)
    assert classpath == "airflow_repl.triggers.quiescing.TracerTokenTrigger"
    assert set(kwargs) == {"topology_path", "publication", "token_id", "subscribers", "poll_interval", "end_time"}
    # rebuilt from its serialized form (as the triggerer does), the trigger times out with what is behind
    late = TracerTokenTrigger(**{**kwargs, "end_time": time.time() - 1})
    event = first_event(late)
    assert event["status"] == "timeout" and "run the Log Reader Agent" in event["message"]
    with pytest.raises(AirflowSensorTimeout, match="run the Log Reader Agent"):
        sensor.execute_complete({}, event)
    cycle(topo, "sub1", "sub2")
    event = first_event(TracerTokenTrigger(**kwargs))
    assert event["status"] == "success"
    assert sensor.execute_complete({}, event) == event["position"] is not None


def test_trigger_error_event_fails_the_sensor(env, spark, tmp_path):
    setup_items(env, spark)
    path = items_topology_file(env, tmp_path)
    trigger = TracerTokenTrigger(topology_path=path, publication="p", token_id=4242, poll_interval=0.1)
    event = first_event(trigger)
    assert event["status"] == "error" and "no tracer token 4242" in event["message"]
    sensor = TracerTokenSensor(task_id="wait", topology=path, publication="p", token_id=4242)
    with pytest.raises(AirflowException, match="no tracer token 4242"):
        sensor.execute_complete({}, event)


# ---------------------------------------------------------------------- TopologyQuiescedSensor
def test_quiesced_sensor_pokes_until_read_and_delivered_everywhere(env2, spark, tmp_path):
    topo = setup_items(env2, spark)
    path = items_topology_file(env2, tmp_path)
    env2.run(env2.pub, "UPDATE items SET v = 'x' WHERE id <= 3")
    env2.run(env2.pub, "UPDATE items SET v = 'y' WHERE id = 4")
    sensor = TopologyQuiescedSensor(task_id="quiet", topology=path, publication="p", poke_interval=0.1)
    assert sensor.poke({}) is False
    assert "the Log Reader of publication 'p'" in sensor.last_status.message
    assert sensor.last_status.lags[0].agent == quiescing.LOG_READER
    position = sensor.position
    log_reader_agent.run_log_reader(topo, "p")
    assert sensor.poke({}) is False
    assert sensor.last_status.message == (
        f"subscription p -> sub1 is 2 transaction(s) behind position {position} (delivered up to "
        f"{sensor.last_status.lags[0].message.split('delivered up to ')[1].split(')')[0]}): run the Distribution "
        f"Agent for sub1; subscription p -> sub2 is 2 transaction(s) behind position {position} (delivered up to "
        f"{sensor.last_status.lags[1].message.split('delivered up to ')[1].split(')')[0]}): run the Distribution "
        f"Agent for sub2"
    )
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert sensor.poke({}) is False and [lag.subscriber for lag in sensor.last_status.lags] == ["sub2"]
    env2.run(env2.pub, "UPDATE items SET v = 'later' WHERE id = 5")  # after the position: not waited for
    distribution_agent.run_distribution(topo, "p", "sub2")
    assert sensor.poke({}) is True and sensor.position == position
    assert sensor.execute({}) == position  # poke mode: execute returns the position at once


def test_quiesced_sensor_timeout_in_poke_mode_says_what_is_behind(env, spark, tmp_path):
    topo = setup_items(env, spark)
    path = items_topology_file(env, tmp_path)
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    sensor = TopologyQuiescedSensor(task_id="quiet", topology=path, publication="p", poke_interval=0.1, timeout=0)
    with pytest.raises(AirflowSensorTimeout, match=r"p -> sub1 is 1 transaction\(s\) behind .* Distribution Agent"):
        sensor.execute({})


def test_quiesced_sensor_defers_keeping_its_position_and_the_trigger_fires(env, spark, tmp_path):
    topo = setup_items(env, spark)
    path = items_topology_file(env, tmp_path)
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id = 1")
    sensor = TopologyQuiescedSensor(task_id="quiet", topology=path, publication="p", deferrable=True, poke_interval=0.2)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    classpath, kwargs = assert_no_secret(deferred.value.trigger, env)
    assert classpath == "airflow_repl.triggers.quiescing.TopologyQuiescedTrigger"
    assert kwargs["position"] == sensor.position and kwargs["token_id"] is None
    env.run(env.pub, "UPDATE items SET v = 'after' WHERE id = 2")  # after the position
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")
    event = first_event(TopologyQuiescedTrigger(**kwargs))
    assert event == {"status": "success", "position": sensor.position, "message": event["message"]}
    assert sensor.execute_complete({}, event) == sensor.position


def test_quiesced_up_to_a_token(env, spark, tmp_path):
    topo = setup_items(env, spark)
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id = 1")
    token = tracer.post_tracer_token(topo, "p")
    status = quiescing.check_quiesced(topo, "p", token_id=token)
    assert not status.done and "tracer token" in status.message and "run the Log Reader Agent" in status.message
    log_reader_agent.run_log_reader(topo, "p")
    status = quiescing.check_quiesced(topo, "p", token_id=token)
    assert [(lag.subscriber, lag.behind, lag.agent) for lag in status.lags] == [("sub1", 2, quiescing.DISTRIBUTION)]
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert quiescing.check_quiesced(topo, "p", token_id=token).done


def test_an_idle_log_reader_run_reads_past_the_position(env, spark):
    topo = setup_items(env, spark)
    position = quiescing.start_position(topo, "p")
    env.run(env.pub, "CREATE TABLE unpublished (i int); INSERT INTO unpublished VALUES (1)")
    assert quiescing.check_quiesced(topo, "p", position=position).lags[0].agent == quiescing.LOG_READER
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 0
    assert quiescing.check_quiesced(topo, "p", position=position).done


# ---------------------------------------------------------------------- updatable subscriptions block quiescence
def test_a_queued_change_blocks_quiescence_until_the_queue_reader_ran(env, spark, tmp_path):
    topo = setup_queued(env, spark)
    env.run(env.sub, "UPDATE items SET v = 'at the subscriber' WHERE id = 1")
    path = written_topology(topo, tmp_path)
    sensor = TopologyQuiescedSensor(task_id="quiet", topology=path, publication="p")
    sensor.position = quiescing.start_position(topo, "p")
    log_reader_agent.run_log_reader(topo, "p")  # nothing published to read: only the queue is behind
    assert sensor.poke({}) is False
    (lag,) = sensor.last_status.lags
    assert (lag.subscriber, lag.behind, lag.agent) == ("sub1", 1, quiescing.QUEUE_READER)
    assert "subscriber 'sub1' has 1 queued change(s)" in lag.message and "run the Queue Reader Agent" in lag.message
    queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert sensor.poke({}) is True


def test_an_in_doubt_immediate_transaction_blocks_quiescence(env, spark, tmp_path):
    topo = setup_immediate(env, spark)
    position = quiescing.start_position(topo, "p")
    log_reader_agent.run_log_reader(topo, "p")  # read up to the position (an agent run resolves in-doubt ones first)
    env.run(env.sub, "UPDATE items SET v = 'immediate' WHERE id = 1")  # prepared at the publisher, undecided
    status = quiescing.check_quiesced(topo, "p", position=position)
    (lag,) = status.lags
    assert (lag.subscriber, lag.behind, lag.agent) == ("sub1", 1, quiescing.RESOLVER)
    assert "1 immediate-updating transaction(s) of subscriber 'sub1' are in doubt" in status.message
    in_doubt.resolve_in_doubt(topo, "p")
    assert quiescing.check_quiesced(topo, "p", position=position).done


# ---------------------------------------------------------------------- registration and serialization (no servers)
def test_provider_info_lists_the_sensor_trigger_and_operator_modules_and_they_import():
    info = airflow_repl.get_provider_info()
    modules = {
        kind: [m for entry in info[kind] for m in entry["python-modules"]]
        for kind in ("sensors", "triggers", "operators")
    }
    assert "airflow_repl.sensors.quiescing" in modules["sensors"]
    assert "airflow_repl.triggers.quiescing" in modules["triggers"]
    assert "airflow_repl.operators.tracer" in modules["operators"]
    for name in [m for ms in modules.values() for m in ms]:
        importlib.import_module(name)
    sensors = importlib.import_module("airflow_repl.sensors.quiescing")
    assert {"TracerTokenSensor", "TopologyQuiescedSensor"} <= set(vars(sensors))
    assert hasattr(importlib.import_module("airflow_repl.operators.tracer"), "PostTracerTokenOperator")


def test_triggers_serialize_ids_only_and_round_trip():
    token = TracerTokenTrigger(
        topology_path="/t.yaml", publication="p", token_id="5", subscribers=["s"], poll_interval=2
    )
    path, kwargs = token.serialize()
    assert path == "airflow_repl.triggers.quiescing.TracerTokenTrigger"
    assert kwargs == {
        "topology_path": "/t.yaml",
        "publication": "p",
        "poll_interval": 2,
        "end_time": None,
        "token_id": 5,
        "subscribers": ["s"],
    }
    assert TracerTokenTrigger(**kwargs).serialize() == (path, kwargs)
    quiet = TopologyQuiescedTrigger(topology_path="/t.yaml", publication="p", position="0/5", end_time=9.5)
    path, kwargs = quiet.serialize()
    assert path == "airflow_repl.triggers.quiescing.TopologyQuiescedTrigger"
    assert (kwargs["position"], kwargs["token_id"], kwargs["end_time"]) == ("0/5", None, 9.5)


def test_sensors_default_to_the_default_deferrable_setting():
    assert TracerTokenSensor(task_id="a", topology="/t", publication="p", token_id=1).deferrable is False
    sensor = TopologyQuiescedSensor(task_id="b", topology="/t", publication="p", deferrable=True)
    assert sensor.deferrable is True and "token_id" in sensor.template_fields
    assert "token_id" in TracerTokenSensor.template_fields and "subscribers" in TracerTokenSensor.template_fields


def test_the_quiesced_sensor_refuses_reschedule_mode_without_a_token():
    with pytest.raises(ValueError, match="mode='reschedule' would take a new position at each reschedule"):
        TopologyQuiescedSensor(task_id="q", topology="/t", publication="p", mode="reschedule")
    sensor = TopologyQuiescedSensor(task_id="q", topology="/t", publication="p", mode="reschedule", token_id=3)
    assert sensor.mode == "reschedule"


def test_post_tracer_token_operator_returns_the_token_id_and_fails_clearly(env, spark, tmp_path):
    setup_items(env, spark)
    path = items_topology_file(env, tmp_path)
    token = PostTracerTokenOperator(task_id="post", topology=path, publication="p").execute({})
    assert env.rows(env.dist, "SELECT token_id, publication FROM airflow_repl.tracer_tokens") == [(token, "p")]
    with pytest.raises(AirflowFailException, match=r"posting a tracer token failed .*'nope'"):
        PostTracerTokenOperator(task_id="post", topology=path, publication="nope").execute({})
