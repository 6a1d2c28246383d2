"""No import crosses the lines the engine's docstrings draw.

The layers come from the docstring of :mod:`airflow_repl.engine` itself (the line
``errors < model < ... < agents``; packages on one layer are separated by commas), so the rule and
its statement cannot drift apart; its package table and each package's "May import" paragraph
must agree with that line.  Then every module under ``airflow_repl/`` is parsed (``ast``, nothing
imported) and every import, at any depth (inside functions and ``TYPE_CHECKING`` blocks too), is
checked:

* an engine package imports only from itself and from the packages of lower layers (``errors``,
  the bottom layer, from anywhere), and nothing of ``airflow_repl`` outside the engine;
* the engine never imports Airflow or PySpark; only ``airflow_repl/jobs/`` imports PySpark;
* the presentation (:mod:`airflow_repl.presentation`, above the engine) imports only the engine
  and itself of ``airflow_repl``, and no database driver, Airflow or PySpark;
* the model imports no database driver, and neither does anything it imports: a subprocess
  imports every model module and looks at ``sys.modules``.

And every module of each engine package, and of the Airflow and Spark layers above it
(``jobs``, ``hooks``, ``operators``, ``sensors``, ``triggers``), is named (````name````) in its
package docstring's "Owns:" paragraph, so that the docstring says where each thing lives.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import airflow_repl.engine

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "airflow_repl"
ENGINE = "airflow_repl.engine"
DRIVERS = ("psycopg", "psycopg2", "asyncpg", "pymysql")
ENGINE_NEVER = ("airflow", "pyspark")
PRESENTATION = "airflow_repl.presentation"


# ---------------------------------------------------------------------- the layers, from the docstring
def parse_layers(docstring: str) -> list[tuple[str, ...]]:
    """``a < b, c < d`` (the one line of the docstring made of names, commas and '<') as
    [("a",), ("b", "c"), ("d",)]."""
    lines = [line.strip() for line in docstring.splitlines() if re.fullmatch(r"\s*\w+( *[<,] *\w+)+\s*", line)]
    assert len(lines) == 1, f"the engine's docstring should state its layers on one line, found {lines}"
    return [tuple(name.strip() for name in layer.split(",")) for layer in lines[0].split("<")]


def table_packages(docstring: str) -> list[str]:
    """The packages of the docstring's table, in its order."""
    return re.findall(r"^``(\w+)``\s{2,}", docstring, flags=re.MULTILINE)


LAYERS = parse_layers(airflow_repl.engine.__doc__ or "")
LAYER_OF = {name: level for level, layer in enumerate(LAYERS) for name in layer}


def allowed_below(package: str) -> set[str]:
    """The engine packages ``package`` may import besides itself."""
    return {name for name, level in LAYER_OF.items() if level < LAYER_OF[package]}


def test_the_layer_line_table_and_tree_agree():
    doc = airflow_repl.engine.__doc__ or ""
    assert LAYERS[0] == ("errors",) and len(LAYER_OF) == sum(len(layer) for layer in LAYERS)
    assert table_packages(doc) == [name for layer in LAYERS for name in layer]
    on_disk = {p.stem for p in (PACKAGE / "engine").iterdir() if p.suffix == ".py" and p.stem != "__init__"}
    on_disk |= {p.name for p in (PACKAGE / "engine").iterdir() if (p / "__init__.py").exists()}
    assert on_disk == set(LAYER_OF), "every engine package or module is on exactly one layer of the docstring"


@pytest.mark.parametrize("package", [name for name in LAYER_OF if name != "errors"])
def test_each_package_docstring_may_import_exactly_the_lower_layers(package):
    doc = (PACKAGE / "engine" / package / "__init__.py").read_text()
    match = re.search(r"May import:(.*?)(\n\s*\n|\"\"\")", doc, flags=re.DOTALL)
    assert match, f"airflow_repl/engine/{package}/__init__.py has no 'May import:' paragraph"
    text = match[1]
    if "every other engine package" in text:
        named = set(LAYER_OF) - {package}
    else:
        named = {a or b for a, b in re.findall(r"``(\w+)``|:mod:`~?airflow_repl\.engine\.(\w+)`", text)}
    assert named == allowed_below(package)


# ---------------------------------------------------------------------- every module owned
OUTER_PACKAGES = ("jobs", "hooks", "operators", "sensors", "triggers", "presentation", "cli")


def owns_paragraph(docstring: str) -> str | None:
    """The docstring's "Owns:" paragraph (up to its first blank line), or None."""
    match = re.search(r"^Owns:(.*?)(?:\n\s*\n|\Z)", docstring, flags=re.DOTALL | re.MULTILINE)
    return match[1] if match else None


def package_modules(folder: Path) -> set[str]:
    """The modules of the package in ``folder``: its ``.py`` files, its compiled modules'
    C sources and its subpackages."""
    found = {p.stem for p in folder.iterdir() if p.suffix in (".py", ".c") and p.stem != "__init__"}
    return found | {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}


def unowned(docstring: str, modules: set[str], where: str) -> str | None:
    """What is wrong with ``docstring``'s "Owns:" list of ``modules`` (the package ``where``), or None."""
    owns = owns_paragraph(docstring)
    if owns is None:
        return f"{where} has no 'Owns:' paragraph"
    missing = sorted(modules - set(re.findall(r"``(\w+)``", owns)))
    if missing:
        return f"{where}'s 'Owns:' list does not name module(s) {', '.join(missing)}: add each with what it owns"
    return None


OWNING_PACKAGES = sorted(
    [str(p.parent.relative_to(REPO)) for p in (PACKAGE / "engine").glob("*/__init__.py")]
    + [f"airflow_repl/{name}" for name in OUTER_PACKAGES]
)


@pytest.mark.parametrize("package", OWNING_PACKAGES)
def test_each_package_docstring_owns_every_module(package):
    folder = REPO / package
    docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    problem = unowned(docstring, package_modules(folder), f"{package}/__init__.py")
    assert problem is None, problem


def test_the_owns_check_names_the_missing_module_and_its_package():
    doc = "What it is.\n\nOwns: ``applier`` (applying) and ``streams``.\n\nMay import: ``bulk_apply``."
    where = "airflow_repl/engine/subscriber/__init__.py"
    assert unowned(doc, {"applier", "streams"}, where) is None
    assert unowned(doc, {"applier", "streams", "bulk_apply", "convergence"}, where) == (
        "airflow_repl/engine/subscriber/__init__.py's 'Owns:' list does not name module(s) bulk_apply, "
        "convergence: add each with what it owns"
    )
    assert unowned("What it is.", {"applier"}, where) == f"{where} has no 'Owns:' paragraph"


# ---------------------------------------------------------------------- the checker
@dataclass(frozen=True)
class Import:
    line: int
    module: str  # the absolute name of the module imported


def _exists(module: str) -> bool:
    """Whether ``module`` is a module or package of this repository's airflow_repl."""
    path = REPO.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports(source: str, module: str, is_package: bool) -> list[Import]:
    """Every import in ``source`` (the module named ``module``), at any depth, resolved to
    absolute module names: ``from pkg import name`` is ``pkg.name`` when that is a module."""
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.append(Import(node.lineno, target if _exists(target) else base))
    return found


def engine_package(module: str) -> str | None:
    """The engine package (or the module ``errors``) that ``module`` belongs to."""
    if not module.startswith(ENGINE + "."):
        return None
    return module.split(".")[2]


def violations(source: str, module: str, path: str, *, is_package: bool = False) -> list[str]:
    """Every import of ``source`` that crosses a line, as ``path:line: what is wrong``."""
    problems: list[str] = []
    mine = engine_package(module)
    for imp in imports(source, module, is_package):
        top = imp.module.split(".")[0]
        theirs = engine_package(imp.module)
        why = None
        if top == "pyspark" and not module.startswith("airflow_repl.jobs."):
            why = "only airflow_repl/jobs/ imports PySpark"
        elif mine is not None and top in ENGINE_NEVER:
            why = f"the engine never imports {top}"
        elif mine == "model" and top in DRIVERS:
            why = "the model imports no database driver"
        elif mine is not None and top == "airflow_repl" and theirs is None and imp.module != ENGINE:
            why = "the engine imports nothing of airflow_repl outside the engine"
        elif mine is not None and theirs is not None and theirs != mine and theirs not in allowed_below(mine):
            below = sorted(allowed_below(mine))
            why = f"{mine} may import only {', '.join(below)}" if below else f"{mine} may import nothing of the engine"
        elif _within(module, PRESENTATION) and top in (*DRIVERS, *ENGINE_NEVER):
            why = f"the presentation draws data it is given: it never imports {top}"
        elif _within(module, PRESENTATION) and top == "airflow_repl" and not _within(imp.module, ENGINE, PRESENTATION):
            why = "the presentation imports only the engine and itself"
        if why:
            problems.append(f"{path}:{imp.line}: imports {imp.module}: {why}")
    return problems


def _within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_crosses_a_line():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 40 and PACKAGE / "engine" / "model" / "topology.py" in files
    problems = [
        problem
        for path in files
        for problem in violations(
            path.read_text(), _module_name(path), str(path.relative_to(REPO)), is_package=path.name == "__init__.py"
        )
    ]
    assert not problems, "imports across the engine's lines:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "module, source, problem",
    [
        ("airflow_repl.engine.model.fake", "import psycopg", "imports psycopg: the model imports no database driver"),
        (
            "airflow_repl.engine.model.fake",
            "\n\ndef f():\n    from psycopg2 import extras\n",  # inside a function, line 4
            "fake.py:4: imports psycopg2: the model imports no database driver",
        ),
        (
            "airflow_repl.engine.model.fake",
            "from airflow_repl.engine.postgres.quoting import ident",
            "imports airflow_repl.engine.postgres.quoting: model may import only errors",
        ),
        (
            "airflow_repl.engine.model.fake",
            "from ..postgres import quoting",  # relative, upward
            "imports airflow_repl.engine.postgres.quoting: model may import only errors",
        ),
        (
            "airflow_repl.engine.model.fake",
            "from airflow_repl.engine import agents",
            "imports airflow_repl.engine.agents: model may import only errors",
        ),
        (
            "airflow_repl.engine.codegen.fake",
            "from airflow_repl.engine.state import dist_history",  # a package of the same layer
            "imports airflow_repl.engine.state.dist_history: codegen may import only articles, errors, mariadb, model, postgres",
        ),
        (
            "airflow_repl.engine.subscriber.fake",
            "import airflow_repl.engine.provisioning.deploy",
            "subscriber may import only articles, codegen, errors, mariadb, model, postgres, state",
        ),
        (
            "airflow_repl.engine.errors",
            "from airflow_repl.engine.model import topology",
            "errors may import nothing of the engine",
        ),
        (
            "airflow_repl.engine.agents.fake",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from airflow.sdk import BaseOperator\n",
            "fake.py:3: imports airflow.sdk: the engine never imports airflow",
        ),
        ("airflow_repl.engine.agents.fake", "import pyspark.sql", "only airflow_repl/jobs/ imports PySpark"),
        (
            "airflow_repl.operators.fake",
            "from pyspark.sql import SparkSession",
            "only airflow_repl/jobs/ imports PySpark",
        ),
        (
            "airflow_repl.engine.agents.fake",
            "from airflow_repl import sandbox",
            "imports airflow_repl.sandbox: the engine imports nothing of airflow_repl outside the engine",
        ),
        (
            "airflow_repl.engine.agents.fake",
            "from airflow_repl.presentation import report_html",
            "the engine imports nothing of airflow_repl outside the engine",
        ),
        ("airflow_repl.presentation.fake", "import psycopg", "the presentation draws data it is given"),
        ("airflow_repl.presentation.fake", "from airflow.sdk import Variable", "it never imports airflow"),
        (
            "airflow_repl.presentation.fake",
            "from airflow_repl import cli",
            "imports airflow_repl.cli: the presentation imports only the engine and itself",
        ),
    ],
)
def test_the_checker_finds_a_forbidden_import(module, source, problem):
    found = violations(source, module, module.rsplit(".", 1)[-1] + ".py")
    assert len(found) == 1 and problem in found[0], found


@pytest.mark.parametrize(
    "module, source",
    [
        ("airflow_repl.engine.model.fake", "from airflow_repl.engine.errors import TopologyError\nimport yaml"),
        ("airflow_repl.engine.model.fake", "from . import naming\nfrom .naming import default_procedure"),
        ("airflow_repl.engine.codegen.fake", "from airflow_repl.engine.articles import resolved\nimport psycopg"),
        ("airflow_repl.engine.agents.fake", "from airflow_repl.engine import errors, state, subscriber"),
        ("airflow_repl.jobs.fake", "from pyspark.sql import SparkSession\nimport airflow_repl.engine.agents"),
        ("airflow_repl.hooks.fake", "from airflow.sdk import BaseHook\nfrom airflow_repl.engine.model import topology"),
        (
            "airflow_repl.presentation.fake",
            "import jinja2\nfrom airflow_repl.engine.agents import status\nfrom . import status_rows",
        ),
        ("airflow_repl.cli", "from airflow_repl.presentation import status_table"),
    ],
)
def test_the_checker_lets_allowed_imports_pass(module, source):
    assert violations(source, module, "fake.py") == []


# ---------------------------------------------------------------------- transitively, in a fresh interpreter
_PROBE = """
import importlib, json, pkgutil, sys
import airflow_repl.engine, airflow_repl.engine.model

def every(package):
    return [package.__name__] + [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]

def loaded(tops):
    return sorted({name.split(".")[0] for name in sys.modules} & set(tops))

model = every(airflow_repl.engine.model)
for name in model:
    importlib.import_module(name)
result = {"model": model, "after_model": loaded(%(drivers)r)}
engine = every(airflow_repl.engine)
for name in engine:
    importlib.import_module(name)
result.update(engine=engine, after_engine=loaded(%(never)r))
print(json.dumps(result))
"""


def test_importing_the_model_loads_no_driver_and_the_engine_no_airflow_or_pyspark():
    probe = _PROBE % {"drivers": DRIVERS, "never": ENGINE_NEVER}
    run = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert "airflow_repl.engine.model.topology" in result["model"] and len(result["engine"]) > 30
    assert result["after_model"] == [], f"importing the model loads a database driver: {result['after_model']}"
    assert result["after_engine"] == [], f"importing the engine loads {result['after_engine']}"


_SNAPSHOT_PROBE = """
import json, sys
import airflow_repl.cli, airflow_repl.jobs.agent_job, airflow_repl.engine.agents.snapshot_agent
at_start = sorted(sys.modules)
airflow_repl.engine.agents.snapshot_agent.snapshot_folder.import_file_modules()
print(json.dumps({"start": at_start, "copying": sorted(sys.modules)}))
"""

#: What a run imports once it has something to copy, not at its start: pyarrow (with numpy),
#: the readers' driver and the COPY text maker (a run that copies nothing and a refusal never
#: need them; a Spark application imports them while its JVM starts).
_WHEN_IT_COPIES = ("pyarrow", "numpy", "adbc_driver_manager", "airflow_repl.engine.postgres.copy_text")


#: What the CLI's Snapshot Agent run (threads, PostgreSQL servers) does not need at its start:
#: the other agents, the MariaDB driver and modules, Spark and Airflow (each costs its import).
_NOT_FOR_A_SNAPSHOT = (
    "airflow",
    "pyspark",
    "pymysql",
    "airflow_repl.engine.agents.distribution_agent",
    "airflow_repl.engine.agents.log_reader_agent",
    "airflow_repl.engine.agents.queue_reader_agent",
    "airflow_repl.engine.agents.mariadb_snapshot",
)


def test_the_snapshot_command_imports_only_what_its_run_needs():
    run = subprocess.run(
        [sys.executable, "-c", _SNAPSHOT_PROBE],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    modules, copying = result["start"], result["copying"]
    assert "airflow_repl.engine.agents.snapshot_agent" in modules and "psycopg" in modules  # the probe did import
    assert [m for m in modules if m in _NOT_FOR_A_SNAPSHOT or m.split(".")[0] in _NOT_FOR_A_SNAPSHOT] == []
    assert [m for m in _WHEN_IT_COPIES if m in modules] == [], "the process's start imports the data files' modules"
    assert [m for m in _WHEN_IT_COPIES if m not in copying] == [], "import_file_modules leaves some out"
    assert [m for m in copying if m in _NOT_FOR_A_SNAPSHOT or m.split(".")[0] in _NOT_FOR_A_SNAPSHOT] == []
