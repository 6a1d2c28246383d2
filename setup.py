"""The package's one compiled module: the Log Reader Agent's row messages as command lines
(airflow_repl/engine/agents/_command_lines.c).  Optional: without a C compiler the package
installs all the same and the agents take the Python path (docs/performance.md)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "airflow_repl.engine.agents._command_lines",
            ["airflow_repl/engine/agents/_command_lines.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
            optional=True,
        )
    ]
)
