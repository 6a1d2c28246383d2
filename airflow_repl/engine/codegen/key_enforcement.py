"""Keeping DEFERRABLE keys enforced under ``session_replication_role = replica``.

A DEFERRABLE primary or unique key is checked by an internal constraint trigger, and, like every
trigger, it does not fire in a session with ``session_replication_role = replica``: a duplicate
key would get in silently.  Such sessions write at subscribers (the Distribution Agent, the
snapshot's loader) and, for queued updating, at the publisher (the Queue Reader).  Firing those
triggers ALWAYS keeps the keys enforced there; a non-deferrable key is checked by its index and
needs nothing.
"""

from __future__ import annotations

from airflow_repl.engine.postgres.quoting import dollar_quote, literal


def enforce_deferrable_keys_script(table: str) -> str:
    """A script that fires the internal triggers checking ``table``'s DEFERRABLE primary and unique
    keys ALWAYS.  ``table`` is the qualified, quoted name.  Idempotent; a table without such keys
    is left as it is."""
    body = (
        "DECLARE\n    trigger_name name;\nBEGIN\n"
        "    FOR trigger_name IN SELECT t.tgname FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_constraint k "
        f"ON k.oid = t.tgconstraint\n        WHERE t.tgrelid = {literal(table)}::regclass AND t.tgisinternal "
        "AND k.contype IN ('p', 'u') LOOP\n"
        f"        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', {literal(table)}::regclass, "
        "trigger_name);\n    END LOOP;\nEND;\n"
    )
    return f"DO {dollar_quote(body)};\n"
