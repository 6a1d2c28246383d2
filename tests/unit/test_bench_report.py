"""The pure parts of ``benchmarks/native_compare.py`` (``make bench``): percentiles, ratios, the
printed table, the JSON file and the checksum query.  The benchmark itself, with its servers and
timings, is not part of the test suite."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "native_compare.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("native_compare", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_percentile_interpolates_between_closest_ranks(bench):
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert bench.percentile(values, 0) == 1.0
    assert bench.percentile(values, 50) == 3.0
    assert bench.percentile(values, 100) == 5.0
    assert bench.percentile(values, 95) == pytest.approx(4.8)
    assert bench.percentile([7.0], 95) == 7.0
    assert bench.percentile([], 50) is None
    with pytest.raises(ValueError, match="between 0 and 100"):
        bench.percentile(values, 101)


def test_ratio_is_ours_over_native(bench):
    assert bench.ratio(3.0, 2.0) == 1.5
    assert bench.ratio(1.0, 4.0) == 0.25
    assert bench.ratio(None, 2.0) is None
    assert bench.ratio(1.0, None) is None
    assert bench.ratio(1.0, 0.0) is None


def test_table_prints_both_figures_and_the_ratio(bench):
    rows = [
        bench.row("initial sync", 4.0, 6.0, "s"),
        bench.row("catch-up: log reader", None, 1.234, "s", compare=False),
        bench.row("peak RSS, snapshot", None, 925.4, "MiB", compare=False),
    ]
    lines = bench.format_table(rows).splitlines()
    assert lines[0] == "| phase | native | airflow-repl | ratio (ours/native) |"
    assert lines[2] == "| initial sync | 4.00 s | 6.00 s | 1.50x |"
    assert lines[3] == "| catch-up: log reader | — | 1.23 s | — |"
    assert lines[4] == "| peak RSS, snapshot | — | 925 MiB | — |"


def test_json_holds_the_run_info_and_the_rows(bench):
    rows = [bench.row("initial sync", 4.0, 2.0, "s")]
    data = json.loads(bench.results_json(rows, {"date": "2026-11-23T19:00:00+00:00", "args": {"scale": 10}}))
    assert data["args"] == {"scale": 10}
    assert data["rows"] == [
        {"phase": "initial sync", "unit": "s", "native": 4.0, "airflow_repl": 2.0, "ratio": 0.5},
    ]


def test_checksum_query_quotes_the_names(bench):
    text = bench.checksum_sql("pgbench_accounts", "aid").as_string(None)
    assert 'ORDER BY t."aid"' in text
    assert 'FROM public."pgbench_accounts" t' in text


def test_pgbench_tps_is_read_from_its_report(bench):
    report = "number of transactions actually processed: 30000\nlatency average = 1.2 ms\ntps = 987.654321 (without initial connection time)\n"
    assert bench.achieved_tps(report) == pytest.approx(987.654321)
    with pytest.raises(bench.BenchFailure, match="no tps figure"):
        bench.achieved_tps("pgbench: error: connection refused")


def test_topology_has_every_table_and_the_subscription_options(bench):
    text = bench.topology_yaml(Path("/tmp/snaps"), {"bulk_apply": True})
    for table in bench.TABLES:
        assert f"      - table: public.{table}\n" in text
    assert text.endswith("  - publication: bench\n    subscriber: s\n    bulk_apply: true\n")
    assert "snapshot_folder: /tmp/snaps\n" in text


def test_bad_arguments_are_one_line_errors(bench, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--transactions", "0"])
    assert exc.value.code == 2
    assert "--transactions must be at least 1" in capsys.readouterr().err


def test_phases_default_to_all_and_always_include_the_initial_sync(bench, capsys):
    assert bench.parse_args([]).phases == set(bench.PHASES)
    assert bench.parse_args(["--phases", "catch-up"]).phases == {"initial", "catch-up"}
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--phases", "initial,catchup"])
    assert exc.value.code == 2
    assert "unknown phase 'catchup'" in capsys.readouterr().err
