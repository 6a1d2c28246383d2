"""Airflow operators: thin wrappers that spark-submit an agent and report its outcome.

Owns: ``agents`` (the Snapshot, Log Reader, Distribution and Queue Reader Agent operators over
one base class), ``schema`` (schema changes and procedure regeneration, run in the worker),
``tracer`` (:class:`~airflow_repl.operators.tracer.PostTracerTokenOperator`, no Spark application),
``validation`` (:class:`~airflow_repl.operators.validation.ValidationOperator`, the ``validate``
entry of the agent job as a Spark application), ``lineage`` (the asset events and OpenLineage datasets of the Snapshot and Distribution Agent
operators), ``metrics`` (each agent run's metrics through Airflow's own ``Stats``, sent by the
agent operators after the run), ``retention`` (``CleanupOperator``, which runs the cleanup agent in the worker: a few
statements, no Spark application) and ``topology`` (``ApplyTopologyOperator``: ``apply`` in the
worker, drops only when allowed).

May import: Airflow, the Spark provider, :mod:`airflow_repl.hooks`, :mod:`airflow_repl.jobs`
(the application's path and its result format) and the engine.  Never PySpark: the agent runs in the submitted application.
"""
