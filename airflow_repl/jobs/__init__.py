"""The Spark application every agent operator submits.

Owns: ``agent_job`` (parses arguments, reads the spec file, dispatches through its ``AGENTS``
table, writes the result file, exits with the error's exit code), ``session`` (the SparkSession) and
``executors`` (which executor runs a task, for the summaries).  The only package that imports
PySpark.

May import: PySpark and :mod:`airflow_repl.engine`; never Airflow (the job runs on Spark).
"""
