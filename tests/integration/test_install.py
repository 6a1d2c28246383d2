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


def test_the_package_builds_without_a_c_compiler(tmp_path):
    """The compiled command lines are optional: with no working C compiler the build goes on
    (setuptools reports the optional module it could not build) and the Log Reader takes the
    Python path."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "CC": "false", "LDSHARED": "false"}
    done = subprocess.run(
        [
            sys.executable,
            "setup.py",
            "-q",
            "build_ext",
            "--build-lib",
            tmp_path / "lib",
            "--build-temp",
            tmp_path / "t",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "_command_lines" in done.stderr and "failed" in done.stderr.lower()
    assert not list((tmp_path / "lib").rglob("*.so"))
