"""Fixtures both test folders use."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

#: ``make bench``'s script: its pure parts are unit-tested, its CPU counting against a real cluster.
BENCH_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "native_compare.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """``benchmarks/native_compare.py`` loaded as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("native_compare", BENCH_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
