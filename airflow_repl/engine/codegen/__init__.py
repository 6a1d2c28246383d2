"""Text the engine generates: SQL procedures, the parameter lists of each call syntax, the
T-SQL-style script a subscriber can run, and the DDL of user-defined types.

Owns: ``call_syntax`` (CALL / SCALL / MCALL / XCALL / SQL parameter lists), ``dialect`` (the
interface every dialect module implements, and their registry), the dialects ``procedures``
(PostgreSQL: the default insert, update and delete procedures in PL/pgSQL), ``tsql_script``
(T-SQL, for SQL Server subscribers) and ``mariadb`` (MariaDB and MySQL subscribers),
``user_types`` (enums, domains, composites, ranges and collations a subscriber needs),
``key_enforcement`` (the triggers that keep DEFERRABLE keys enforced under
``session_replication_role = replica``), ``updating_scripts`` (the row-version column of
updatable subscriptions and its trigger), ``queue_triggers`` (the triggers that queue a queued
updating subscriber's changes) and ``immediate_triggers`` (the dblink and two-phase commit
triggers of immediate updating).

May import: ``errors``, ``model``, ``mariadb``, ``postgres`` and ``articles``.
"""
