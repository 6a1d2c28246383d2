"""Airflow sensors (poke once, then defer to a trigger in :mod:`airflow_repl.triggers`).

Owns: ``wal_retention`` (``WalRetentionSensor``).

May import: Airflow, :mod:`airflow_repl.hooks`, :mod:`airflow_repl.triggers` and the engine.
"""
