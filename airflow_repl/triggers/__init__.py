"""Airflow triggers: asynchronous polls whose ``serialize()`` holds only ids (never a password).

May import: Airflow and the engine.
"""
