"""The agents, one module each (with the helpers only it uses), each run inside the runtime's
:class:`~airflow_repl.engine.runtime.lifecycle.AgentRun`.

Owns: ``snapshot_agent`` (with ``snapshot_folder``: the folder's scripts, Parquet files and
manifest, read and loaded on Spark executors), ``log_reader_agent`` (with ``change_mapping``:
pgoutput row changes to commands; and ``command_lines``, its compiled hot path over the C module
``_command_lines``: a row message straight to the COPY line that stores its command),
``distribution_agent`` (with ``stream_planning``, the pure logic that spreads its batches over
subscription streams, and ``read_ahead``, the next batch read and netted while one is applied
by net change; and ``mariadb_distribution``, its delivery to a MariaDB subscriber
through SQL statements), ``mariadb_snapshot`` (the Snapshot Agent's part at a MariaDB subscriber:
tables by the type map, the load by multi-row INSERTs, keys and watermark), ``queue_reader_agent`` (queued updating: subscribers' queued transactions
applied at the publisher, conflicts resolved by the publication's policy) and ``cleanup_agent``
(retention: delivered commands deleted, idle subscriptions expired).

May import: every other engine package.  Never Airflow, never PySpark: the Snapshot Agent is
handed the SparkSession by :mod:`airflow_repl.jobs` and uses it without importing PySpark.
"""
