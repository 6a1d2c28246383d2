"""Airflow sensors (poke once, then defer to a trigger in :mod:`airflow_repl.triggers`).

Owns: ``quiescing`` (:class:`~airflow_repl.sensors.quiescing.TracerTokenSensor`,
:class:`~airflow_repl.sensors.quiescing.TopologyQuiescedSensor`) and ``wal_retention``
(``WalRetentionSensor``) and ``health`` (``ReplicationHealthSensor``).

May import: Airflow, :mod:`airflow_repl.hooks`, :mod:`airflow_repl.triggers` and the engine.
"""
