"""The agents, one module each, over one lifecycle.

Owns: ``lifecycle`` (:class:`~airflow_repl.engine.agents.lifecycle.AgentRun`: lock, run
history, stale runs, error classification, progress and result), ``snapshot_agent``,
``log_reader_agent`` and ``distribution_agent`` (with ``stream_planning``, the pure logic that
spreads its batches over subscription streams).  A new agent is a module with only its own
logic, run inside an ``AgentRun``.

May import: every other engine package.  Never Airflow, never PySpark: the Snapshot Agent is
handed the SparkSession by :mod:`airflow_repl.jobs` and uses it without importing PySpark.
"""
