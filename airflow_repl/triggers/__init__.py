"""Airflow triggers: asynchronous polls whose ``serialize()`` holds only ids (never a password).

Owns: ``quiescing`` (:class:`~airflow_repl.triggers.quiescing.TracerTokenTrigger`,
:class:`~airflow_repl.triggers.quiescing.TopologyQuiescedTrigger`) and ``wal_retention``
(``WalRetentionTrigger``) and ``health`` (``ReplicationHealthTrigger``).

May import: Airflow, :mod:`airflow_repl.hooks` (servers resolved from connection ids in ``run()``) and the engine.
"""
