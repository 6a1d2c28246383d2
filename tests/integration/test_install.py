"""The installation itself: one Spark release on both sides of py4j."""

from __future__ import annotations

from importlib import metadata


def test_pyspark_python_files_match_the_spark_jvm(spark):
    # pyspark-client (a dependency of the Spark provider) writes its own copy of pyspark's
    # Python files over pyspark's: a different release leaves Python and JVM out of step.
    import pyspark

    assert pyspark.__version__ == spark.version, (
        f"pyspark's Python files are {pyspark.__version__} but its JVM is {spark.version}: install "
        f"pyspark and pyspark-client of the same release (setup.cfg pins them)"
    )
    assert metadata.version("pyspark") == metadata.version("pyspark-client")
