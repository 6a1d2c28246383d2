"""Airflow hooks: the bridge from Airflow's connections to the engine.

Owns: ``replication`` (:class:`~airflow_repl.hooks.replication.ReplicationHook`: loads a
topology and resolves its servers through Airflow's connection store, writes the agents' spec file).

May import: Airflow and :mod:`airflow_repl.engine`.  Holds no replication logic.
"""
