"""The pure parts of ``benchmarks/native_compare.py`` (``make bench``): percentiles, ratios, the
printed table, the JSON file and the checksum query.  The benchmark itself, with its servers and
timings, is not part of the test suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


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


@pytest.mark.parametrize(
    ("title", "role"),
    [
        ("postgres: walsender postgres 127.0.0.1(51234) START_REPLICATION", "walsender"),
        ("postgres: walsender postgres 127.0.0.1(51234) idle", "walsender"),
        ("postgres: logical replication worker for subscription 16401", "apply worker"),
        ("postgres: logical replication apply worker for subscription 16401", "apply worker"),  # PostgreSQL 17
        ("postgres: logical replication worker for subscription 16401 sync 16385", "table sync worker"),
        ("postgres: logical replication tablesync worker for subscription 16401 sync 16385", "table sync worker"),
        ("postgres: postgres bench_dist 127.0.0.1(40112) COPY", "backend bench_dist"),
        ("postgres: postgres bench_sub 127.0.0.1(40114) idle in transaction", "backend bench_sub"),
        ("postgres: alice sales [local] SELECT", "backend sales"),
        ("postgres: checkpointer ", "background"),
        ("postgres: autovacuum worker bench_dist", "background"),
        ("postgres: logical replication launcher ", "background"),
        ("/usr/lib/postgresql/15/bin/postgres -D /var/tmp/x/publisher", "background"),
    ],
)
def test_server_processes_get_their_role_from_their_title(bench, title, role):
    assert bench.process_role(title) == role


def test_catch_up_cpu_rows_add_up_by_role_and_give_the_floor_of_the_serial_parts(bench):
    ended = bench.ENDED
    native_cpu = {
        "publisher": {"walsender": 2.0, "background": 0.1, ended: 0.0},
        "subscriber": {"background": 0.0},
        # the benchmark's own polling (bench_native backends, and what the postmaster forks for them) is left out
        "native": {"apply worker": 4.0, "background": 0.2, "backend bench_native": 0.5, ended: 0.3},
    }
    lr_cpu = {
        "publisher": {"walsender": 2.7, "backend bench_dist": 2.2, "background": 0.1, ended: 0.05},
        "subscriber": {"background": 0.0},
    }
    di_cpu = {
        "publisher": {"backend bench_dist": 1.0, "walsender": 0.0},
        "subscriber": {"backend bench_sub": 2.2, "background": 0.05},
    }
    rows = {r["phase"]: r for r in bench.cpu_rows(4.2, native_cpu, lr_cpu, di_cpu, 3.4, 5.1)}
    by_start = {phase.split(": ", 1)[-1].split(" (")[0]: r for phase, r in rows.items()}
    assert by_start["the publisher's walsender"]["native"] == 2.0
    assert by_start["the publisher's walsender"]["airflow_repl"] == 2.7
    assert by_start["applying at the subscriber"]["native"] == 4.0
    assert by_start["applying at the subscriber"]["airflow_repl"] == 2.2
    assert by_start["our distribution database"]["airflow_repl"] == pytest.approx(3.2)
    assert by_start["our Log Reader's process"]["airflow_repl"] == 3.4
    assert by_start["every process"]["native"] == pytest.approx(2.1 + 4.2)
    assert by_start["every process"]["airflow_repl"] == pytest.approx(2.7 + 3.2 + 0.15 + 2.25 + 3.4 + 5.1)
    floor = next(r for phase, r in rows.items() if phase.startswith("catch-up floor"))
    assert floor["native"] == 4.2
    assert floor["airflow_repl"] == pytest.approx(2.7 + 2.2)
    assert floor["ratio"] == pytest.approx(4.9 / 4.2, abs=0.01)


def test_initial_sync_cpu_rows_compare_each_side_and_leave_out_the_benchmarks_polling(bench):
    ended = bench.ENDED
    native_cpu = {
        "publisher": {"walsender": 1.5, "background": 0.1, ended: 0.2},
        "native": {"table sync worker": 2.0, "apply worker": 0.1, "backend bench_native": 0.4, ended: 0.3},
    }
    ours_cpu = {
        "publisher": {"backend bench_pub": 1.2, "walsender": 0.05, "backend bench_dist": 0.1, ended: 0.15},
        "subscriber": {"backend bench_sub": 2.5, ended: 0.1},
    }
    rows = {r["phase"].split(": ")[-1].split(" (")[0]: r for r in bench.initial_cpu_rows(native_cpu, ours_cpu, 2.3)}
    assert rows["the publisher's processes"]["native"] == pytest.approx(1.8)
    assert rows["the publisher's processes"]["airflow_repl"] == pytest.approx(1.4)  # without the distribution database
    assert rows["the subscriber's processes"]["native"] == pytest.approx(2.1)
    assert rows["the subscriber's processes"]["airflow_repl"] == pytest.approx(2.6)
    assert rows["our distribution database"]["airflow_repl"] == pytest.approx(0.1)
    assert rows["our CLI's process"]["airflow_repl"] == 2.3
    assert rows["every process"]["native"] == pytest.approx(3.9)
    assert rows["every process"]["airflow_repl"] == pytest.approx(1.4 + 0.1 + 2.6 + 2.3)
    assert rows["every process"]["ratio"] == pytest.approx(6.4 / 3.9)


def test_a_sustained_rate_is_held_when_pgbench_reached_it_and_the_lag_stayed_low_and_flat(bench):
    flat = [0.2, 0.3, 0.25, 0.2, 0.3, 0.2, 0.25, 0.3, 0.2, 0.3, 0.25, 0.2]
    assert bench.held(flat, 1000, 998.0) == (True, "lag p95 0.30 s, growth +0.00 s")
    assert bench.held(flat, 1000, 900.0) == (False, "pgbench reached 900 tps only")
    growing = [0.1 * i for i in range(1, 13)]  # a backlog building up: 0.1 s to 1.2 s
    assert bench.held(growing, 1000, 1000.0)[0] is False and "grew" in bench.held(growing, 1000, 1000.0)[1]
    assert bench.held([2.5] * 12, 1000, 1000.0) == (False, "lag p95 2.50 s")
    assert bench.held([0.1] * 3, 1000, 1000.0) == (False, "too few lag samples")
    assert bench.rates(500, 500, 2000) == [500, 1000, 1500, 2000]


def test_bulk_apply_is_the_apply_mode_net_change_and_the_sustained_options_are_checked(bench):
    assert bench.parse_args(["--bulk-apply"]).apply_mode == "net_change"
    assert bench.parse_args([]).apply_mode is None and bench.parse_args([]).sustained_window == 60
    with pytest.raises(SystemExit):
        bench.parse_args(["--bulk-apply", "--apply-mode", "per_command"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--sustained-window", "0"])
