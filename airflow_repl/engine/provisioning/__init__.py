"""``airflow-repl apply``: turning a topology into servers ready to replicate.

Owns: ``deploy`` (checks every server is reachable, resolves articles against the publisher's
catalog, creates the publication and slot, and records publications and subscriptions in the
distribution database).

May import: ``errors``, ``model``, ``postgres``, ``articles``, ``codegen`` and ``state``.
"""
