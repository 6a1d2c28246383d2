"""``airflow-repl apply``: turning a topology into servers ready to replicate.

Owns: ``deploy`` (checks every server is reachable, resolves articles against the publisher's
catalog, creates the publication and slot, and records publications and subscriptions in the
distribution database), ``schema_change`` (``airflow-repl schema-change``: one checked ALTER TABLE
run at the publisher with the message that replicates it in commit order) and
``custom_scripting`` (``airflow-repl register-script``: the scripts that regenerate custom
procedures at subscribers).

May import: ``errors``, ``model``, ``postgres``, ``articles``, ``codegen`` and ``state``.
"""
