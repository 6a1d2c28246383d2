"""The agents, one module each, over one lifecycle.

Owns: ``lifecycle`` (:class:`~airflow_repl.engine.agents.lifecycle.AgentRun`: lock, run
history, stale runs, error classification, progress and result), ``snapshot_agent`` (with
``snapshot_folder``: the folder's scripts, Parquet files and manifest, read and loaded on Spark
executors), ``log_reader_agent`` (with ``change_mapping``: pgoutput row changes to commands; and
``command_lines``, its compiled hot path over the C module ``_command_lines``: a row message
straight to the COPY line that stores its command), ``distribution_agent`` (with
``stream_planning``, the pure logic that spreads its batches over subscription streams, and
``read_ahead``, the next batch read and netted while one is applied under ``bulk_apply``; and
``mariadb_distribution``, its delivery to a MariaDB subscriber through SQL statements),
``mariadb_snapshot`` (the Snapshot Agent's part at a MariaDB subscriber: tables by the type map,
the load by multi-row INSERTs, keys and watermark),
``queue_reader_agent`` (queued updating: subscribers' queued transactions applied at the
publisher, conflicts resolved by the publication's policy), ``cleanup_agent`` (retention:
delivered commands deleted, idle subscriptions expired), ``tracer`` (posting tracer tokens,
their latency history), ``status`` (each subscription's backlog, watermark, last runs, last
error, lag and expiry, and which run counts as failed: ``airflow-repl status``), ``health``
(each subscription against its monitoring thresholds: ``status --check``), ``progress_lines``
(the INFO progress lines of long runs, at most every ``AIRFLOW_REPL_PROGRESS_INTERVAL``
seconds), ``report`` (the data of ``airflow-repl report``; :mod:`airflow_repl.presentation`
draws it, and the status table, outside the engine), ``quiescing`` (the checks of the quiescing
sensors: a token arrived, a topology quiesced up to a position), ``procedure_regeneration``
(``airflow-repl regenerate-procs``: procedures recreated at subscribers on demand),
``wal_retention`` (the WAL a publication's slot retains against its
limit; the Log Reader warns), ``continuous`` (continuous mode of the Log Reader, Distribution
and Queue Reader Agents: the options, whether the loop takes another turn, SIGTERM, progress),
``subscriber_writer`` (the turns the Distribution Agent and the Queue Reader take at a queued
subscriber: one batch, one queued transaction) and ``gc_pause`` (Python's cyclic garbage
collector paused while a batch is read or applied).  A new agent is a module with only its own
logic, run inside an ``AgentRun`` (the lifecycle module's documentation says how to write one).

May import: every other engine package.  Never Airflow, never PySpark: the Snapshot Agent is
handed the SparkSession by :mod:`airflow_repl.jobs` and uses it without importing PySpark.
"""
