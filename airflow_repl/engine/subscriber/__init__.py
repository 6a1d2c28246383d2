"""The subscriber side: applying commands there, and the data validation that compares a
subscriber's tables with the publisher's.

Owns: ``statements`` (one prepared statement per article and operation, with the row-not-found
check), ``mariadb_apply`` (the same at a MariaDB subscriber: SQL statements, applied in a batch
or replayed with a savepoint per transaction), ``mariadb_calls`` (the generated and custom
procedures a MariaDB subscriber's articles call, created, checked and called with their call
syntax's parameters), ``mariadb_schema_changes`` (a replicated schema change there in MariaDB's
DDL, exactly once although that DDL commits on its own), ``mariadb_net_change`` (a batch's net
change applied at a MariaDB subscriber: multi-row DELETE, UPDATE ... JOIN and INSERT per article),
``mariadb_validation`` (a MariaDB subscriber
compared with the publisher by canonical value: the tasks of ``validation``'s passes for it), ``applier`` (the apply backend: pipelined, over several streams at once, or replayed
command by command), ``net_change`` (a batch's commands collapsed to their net effect per key, and
which articles may go that way under ``apply_mode``: pure, for both engines), ``bulk_apply``
(that net change applied at a PostgreSQL subscriber with set-based statements), ``conflicts`` (what a failed command means:
skip its transaction or stop; and the queued updating conflict rules), ``superseded`` (the
publisher's commands an updatable subscriber's own later changes supersede), ``convergence``
(delivery to a queued updating subscriber: the publisher's commands converging with rows the
subscriber changed itself), ``row_images`` (rows written and read as JSON images), ``streams``
(the connections of one delivery, their two-phase commit and its recovery), ``mariadb_streams``
(the same at a MariaDB subscriber, with XA transactions), ``two_phase`` (the names of a batch's
prepared transactions and what recovery decides of them, for both engines), ``in_doubt`` (the
resolver of immediate updating's transactions prepared at the publisher), ``validation``
(order- and encoding-independent checksums, differing keys) and ``schema_changes`` (a
replicated schema change applied to the destination table, and the article's procedures
regenerated, in the delivering transaction).

May import: ``errors``, ``model``, ``mariadb``, ``postgres``, ``articles``, ``codegen`` and ``state``.
"""
