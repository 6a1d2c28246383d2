"""The SparkSession an agent runs in."""

from __future__ import annotations

import os
import sys


def spark_session(app_name: str, master: str | None = None):
    """The SparkSession of the running spark-submit application, or else a local one
    (CLI, tests) on ``master`` / $AIRFLOW_REPL_SPARK_MASTER / ``local[2]``.

    Python workers use this interpreter unless PYSPARK_PYTHON says otherwise, so executors
    import the same installed airflow_repl.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # set by spark-submit's PythonRunner
    if not under_submit:
        builder = builder.master(master or os.environ.get("AIRFLOW_REPL_SPARK_MASTER", "local[2]")).config(
            "spark.ui.enabled", "false"
        )
    return builder.config("spark.sql.shuffle.partitions", "4").getOrCreate()
