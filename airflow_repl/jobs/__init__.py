"""The Spark application every agent operator submits.

Owns: ``agent_job`` (parses arguments, reads the spec file, dispatches through its ``AGENTS``
table, writes the result file, exits with the error's exit code), ``session`` (the SparkSession),
``class_archive`` (the Spark driver's class-data archive, AppCDS, that halves its start),
``local_tasks`` (an agent's tasks run in threads of this process where a local Spark
application would only add its start: the CLI's Snapshot Agent without a master) and
``executors`` (which executor runs a task, for the summaries) and ``continuous_options`` (the
continuous options of the CLI's and the job's command lines).  The only package that imports
PySpark.

May import: PySpark and :mod:`airflow_repl.engine`; never Airflow (the job runs on Spark).
"""
