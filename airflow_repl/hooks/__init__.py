"""Airflow hooks: the bridge from Airflow's connections to the engine.

Owns: ``connections`` (a server's connection id found by Airflow's own lookup, the Postgres
connection turned into libpq settings as ``PostgresHook`` does, every extra kept) and ``replication``
(:class:`~airflow_repl.hooks.replication.ReplicationHook`, connection type ``airflow_repl``: loads a
topology and resolves its servers through ``connections``, writes the agents' spec file).

May import: Airflow, the Postgres provider and :mod:`airflow_repl.engine`.  Holds no replication logic.
"""
