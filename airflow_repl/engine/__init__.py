"""The replication engine: plain Python over psycopg, with no Airflow and no PySpark.

Packages, from the bottom layer up; a package imports only from the layers below it (and
:mod:`~airflow_repl.engine.errors`, which every layer may use).  Packages that share a layer do
not import each other:

    errors < model < mariadb < postgres < articles < codegen, state < subscriber, provisioning < agents

=================  ==========================================================================
``errors``         the error classes, their exit codes and whether a retry can help
``model``          the topology as the user writes it: validated, no server, no database driver
``mariadb``        MariaDB (MySQL) subscribers' access: connections, quoting, the type map,
                   the catalog checks (below ``postgres``, which resolves their URIs through it)
``postgres``       PostgreSQL access: connections, quoting, the catalog, WAL positions, pgoutput
``articles``       articles resolved against the publisher's catalog, and the commands on them
``codegen``        text the engine generates: procedures, call syntaxes, T-SQL, user types
``state``          where the agents keep their state: every SQL statement on the distribution
                   database's and the subscribers' ``airflow_repl`` tables
``subscriber``     applying commands at a subscriber, and checking it against the publisher
``provisioning``   ``airflow-repl apply``: publications, slots and subscriptions set up
``agents``         the Snapshot, Log Reader, Distribution, Queue Reader and cleanup agents
                   over one run lifecycle and its continuous mode; status, the report, tracer
                   tokens, WAL retention and the quiescing checks
=================  ==========================================================================

``tests/unit/test_import_boundaries.py`` fails when an import crosses these lines.  The Airflow
layer (:mod:`airflow_repl.hooks`, ``operators``, ``sensors``, ``triggers``), the Spark job
(:mod:`airflow_repl.jobs`) and the command's presentation (:mod:`airflow_repl.presentation`: the
status table, the report's page) sit above the engine; see ``docs/architecture.md``.
"""
