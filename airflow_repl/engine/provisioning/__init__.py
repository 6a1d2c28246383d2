"""``airflow-repl plan`` and ``apply``: turning a topology into servers ready to replicate.

Owns: ``plan`` (``airflow-repl plan`` and ``apply``: what applying changes, computed from the
servers without changing them, then carried out, drops only when allowed), ``deploy`` (checks every server is reachable, resolves articles against the publisher's
catalog, creates the publication and slot, and records publications and subscriptions in the
distribution database), ``schema_change`` (``airflow-repl schema-change``: one checked ALTER TABLE
run at the publisher with the message that replicates it in commit order),
``custom_scripting`` (``airflow-repl register-script``: the scripts that regenerate custom
procedures at subscribers), ``updating_setup`` (``apply`` for updatable subscriptions: the rules
checked first, the row versions added at the publisher), ``update_mode``
(``airflow-repl set-update-mode``: a failover subscription switched between immediate and
queued updating), ``pausing`` (``airflow-repl pause|resume`` and the topology key ``paused``:
one subscription paused, which the Distribution Agent skips, and resumed) and ``drop``
(``airflow-repl drop``: an article, a subscription or a publication retired, with what the
product installed for it, resumable when stopped halfway; ``mariadb_drop``: the same at a
MariaDB subscriber) and ``procedure_regeneration``
(``airflow-repl regenerate-procs``: procedures recreated at subscribers on demand).

May import: ``errors``, ``model``, ``mariadb``, ``postgres``, ``articles``, ``codegen``, ``state``,
``subscriber`` and ``runtime``.
"""
