"""No test module imports another test module: what two test modules share lives in a helper
module (``tests/integration/harness.py``, ``agent_runner.py``, ``spark_cluster.py``,
``tests/unit/article_builder.py``) or in a ``conftest.py`` fixture.

Every ``.py`` file under ``tests/`` is parsed (``ast``, nothing imported) and every import, at
any depth, is checked: importing a ``test_*`` module or a ``conftest`` (by its bare name, as
pytest's ``sys.path`` allows, or by its ``tests....`` path) is refused, naming the file, the
line and the module.  So is importing a private name (``_x``) from a helper module: a
name another module uses is public.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
HELPERS = ("harness", "agent_runner", "spark_cluster", "article_builder")


def is_test_module(name: str) -> bool:
    """Whether the dotted module ``name`` is a test module (``test_*``) or a ``conftest``."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every module an import statement names, at any depth; for
    ``from package import name`` both ``package`` and ``package.name`` (``name`` may be a module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def imports_of_test_modules(source: str, where: str) -> list[str]:
    """One line per import of a test module, or of a helper module's private name, in
    ``source`` (the file ``where``)."""
    problems = []
    for line, module in imported_modules(ast.parse(source)):
        package, _, name = module.rpartition(".")
        if is_test_module(module):
            problems.append(
                f"{where}:{line} imports test module {module!r}: move what it shares into a helper module "
                f"({', '.join(HELPERS)}) or a conftest fixture"
            )
        elif package.rsplit(".", 1)[-1] in HELPERS and name.startswith("_"):
            problems.append(f"{where}:{line} imports private {name!r} from {package!r}: make it public there")
    return problems


def test_no_test_module_imports_another_test_module():
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 50, "the test files were not found"
    problems = [
        problem for path in files for problem in imports_of_test_modules(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "source, line, module",
    [
        ("from test_agents import cycle", 1, "test_agents"),
        ("import os\nfrom tests.integration.test_cli import orders_topology_file", 2, "tests.integration.test_cli"),
        ("import test_continuous", 1, "test_continuous"),
        ("from tests.integration import test_queued_updating", 1, "tests.integration.test_queued_updating"),
        ("def f():\n    from test_tracer_tokens import setup_items", 2, "test_tracer_tokens"),
        ("from conftest import env", 1, "conftest"),
    ],
)
def test_an_import_of_a_test_module_is_found_and_named(source, line, module):
    (problem,) = imports_of_test_modules(source, "tests/integration/test_x.py")
    assert problem.startswith(f"tests/integration/test_x.py:{line} imports test module {module!r}: ")


@pytest.mark.parametrize(
    "source",
    [
        "from harness import assert_in_sync, cycle",
        "import spark_cluster",
        "from article_builder import text_article",
        "from tests.unit.article_builder import text_article",
        "from airflow_repl.engine.agents import tracer",
        "from . import testing",
    ],
)
def test_imports_of_helpers_and_of_the_package_are_allowed(source):
    assert imports_of_test_modules(source, "tests/integration/test_x.py") == []


def test_a_private_name_of_a_helper_module_is_refused():
    (problem,) = imports_of_test_modules("from harness import _resolved, to_uri", "tests/integration/test_x.py")
    assert problem == "tests/integration/test_x.py:1 imports private '_resolved' from 'harness': make it public there"
