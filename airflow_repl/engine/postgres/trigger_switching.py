"""Switching a table's triggers on or off: one statement, every identifier quoted.

``ALTER TABLE schema.table ENABLE TRIGGER a, ENABLE TRIGGER b`` (or ``DISABLE``): a disabled
trigger stays defined but does not fire; an enabled one fires as PostgreSQL's session
replication role says (``ENABLE``, not ``ENABLE ALWAYS`` nor ``ENABLE REPLICA``).  The updatable
subscriptions keep the triggers of both update modes on a failover subscription's tables and
enable those of the mode it is in.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql


def switch_triggers(schema: str, table: str, triggers: Sequence[str], *, enabled: bool) -> sql.Composed:
    """The statement that enables (or disables) ``triggers`` (at least one) of ``schema.table``."""
    if not triggers:
        raise ValueError(f"no trigger to switch on {schema}.{table}")
    action = sql.SQL("ENABLE TRIGGER {}" if enabled else "DISABLE TRIGGER {}")
    return sql.SQL("ALTER TABLE {} {}").format(
        sql.Identifier(schema, table), sql.SQL(", ").join(action.format(sql.Identifier(name)) for name in triggers)
    )
