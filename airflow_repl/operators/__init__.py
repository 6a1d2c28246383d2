"""Airflow operators: thin wrappers that spark-submit an agent and report its outcome.

Owns: ``agents`` (the Snapshot, Log Reader and Distribution Agent operators over one base class).

May import: Airflow, the Spark provider, :mod:`airflow_repl.hooks` and
:mod:`airflow_repl.engine.errors`.  Never PySpark: the agent runs in the submitted application.
"""
