"""PostgreSQL access: everything that knows how to talk to a server.

Owns: connections and their session settings (``connections``), identifier and literal
quoting (``quoting``), raw ``$n`` statements (``raw_sql``), catalog reads of tables, keys and
columns (``catalog``), WAL positions (``lsn``), the pgoutput protocol decoder (``pgoutput``) and
logical replication slots with their exported snapshots (``slots``), a slot's changes over the
streaming replication protocol (``replication_stream``), where a table lives as Airflow asset
URIs and OpenLineage datasets name it (``addresses``), a query's rows as Arrow record batches
inside an exported snapshot (``arrow_reads``, with ADBC's driver), COPY's text format: a field's
escapes (``copy_escaping``) and Arrow record batches as ``COPY ... FROM STDIN`` text
(``copy_text``), every advisory lock the product takes, one
function each (``advisory_locks``), the statement that switches a table's triggers on or off
(``trigger_switching``), SIGTERM and SIGINT as a stop that cuts a long-running loop's waits
and statements short (``stop_signals``), and JSON values whose numbers stay exact through Python
(``json_values``).

May import: :mod:`airflow_repl.engine.errors`, :mod:`airflow_repl.engine.model`,
:mod:`airflow_repl.engine.mariadb` (a ``mariadb://`` subscriber reference is resolved through it),
psycopg and ADBC's PostgreSQL driver.
Nothing here knows about articles, agents or the distribution database.
"""
