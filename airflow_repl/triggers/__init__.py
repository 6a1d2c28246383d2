"""Airflow triggers: asynchronous polls whose ``serialize()`` holds only ids (never a password).

Owns: ``wal_retention`` (``WalRetentionTrigger``).

May import: Airflow and the engine.
"""
