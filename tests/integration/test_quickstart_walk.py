"""The quickstart's walk through the command line on the sandbox (docs/quickstart.md, "The command
line on the sandbox, step by step"), run exactly as the page writes it: its ``bash`` blocks,
extracted from the page, in one shell, so that the page cannot drift from what works.  Every
command of the parser is in the walk, but the three the page names as left out."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_repl import cli
from airflow_repl.sandbox import Sandbox

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## The command line on the sandbox, step by step"
LEFT_OUT = {"demo", "set-update-mode", "register-script"}
MARK = "### walk: "
#: Spark's own console output, which must stay off the console unless -v
NOISE = ("[Stage ", " WARN ", "log4j", "TaskSetManager", "at org.apache", "Traceback")


def walk_blocks() -> list[list[str]]:
    """The section's ``bash`` blocks, each a list of its command lines."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"^```bash\n(.*?)^```$", section, re.M | re.S)
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


def commands_in(blocks: list[list[str]]) -> set[str]:
    return {m[1] for block in blocks for line in block if (m := re.match(r"airflow-repl (\S+)", line))}


def test_the_walk_names_every_command_but_those_it_says_it_leaves_out():
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert commands_in(walk_blocks()) == set(subs.choices) - LEFT_OUT
    text = (ROOT / "docs" / "quickstart.md").read_text()
    assert all(f"`{name}`" in text[text.index(SECTION) :] for name in LEFT_OUT)


def _script(blocks: list[list[str]], state_copy: Path) -> str:
    """The blocks as one bash script: each command as written, after a marker line naming it
    (on stdout and stderr); before the last block, a copy of the sandbox's state (its password)."""
    lines = ["set -eo pipefail"]
    for i, block in enumerate(blocks):
        if i == len(blocks) - 1:
            lines.append(f"cp .sandbox/sandbox.json {state_copy}")
        for command in block:
            marker = shlex.quote(MARK + command)  # printed as it is: nothing in it expanded
            lines += [f"echo {marker}; echo {marker} >&2", command]
    return "\n".join(lines) + "\n"


def _by_command(output: str) -> dict[str, str]:
    """What each command printed, by its line (the last run of a line that runs twice)."""
    found: dict[str, str] = {}
    for part in output.split(MARK)[1:]:
        command, _, printed = part.partition("\n")
        found[command] = printed
    return found


def test_the_quickstart_walk_runs_as_written(tmp_path):
    blocks = walk_blocks()
    work, home = tmp_path / "checkout", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "dags").symlink_to(ROOT / "dags")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "PG"))}
    env |= {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    state = tmp_path / "state.json"
    script = tmp_path / "walk.sh"
    script.write_text(_script(blocks, state))
    try:
        done = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        if (work / ".sandbox").exists():
            Sandbox(work / ".sandbox").destroy()
    out, err = _by_command(done.stdout), _by_command(done.stderr)
    assert done.returncode == 0, (
        f"the walk stopped (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )
    assert set(out) == {c for block in blocks for c in block}  # every command ran

    password = json.loads(state.read_text())["password"]
    assert len(password) > 10 and password not in done.stdout + done.stderr  # shown only by env, which eval read
    init = json.loads(out["airflow-repl sandbox init-demo"])
    assert init["publisher_rows"]["orders"] == 40000 and set(init["databases"]) >= {"repl_publisher", "repl_branch_b"}

    status = out["airflow-repl status       -t dags/demo_topology.yaml"]
    row = status.splitlines()[1]
    assert row.split()[:4] == ["shop", "reporting", "active", "2"], status  # the update and the tracer token
    until = json.loads(out["airflow-repl distribution -t dags/demo_topology.yaml --until 2026-01-01T00:00:00+00:00"])
    (sub,) = until["subscriptions"]
    assert sub["transactions"] == 0 and sub["left_by_until"]["transactions"] == 2, until
    warning = err["airflow-repl distribution -t dags/demo_topology.yaml --until 2026-01-01T00:00:00+00:00"]
    assert "WARNING" in warning and "left 2 pending transaction(s)" in warning, warning
    validate = out["airflow-repl validate -t dags/demo_topology.yaml"]
    assert validate.count(" yes") == 4 and " no" not in validate, validate
    for command in (
        "airflow-repl validate -t dags/demo_topology.yaml",
        "airflow-repl snapshot -t dags/demo_topology.yaml",
    ):
        assert not [n for n in NOISE if n in out[command] + err[command]], (command, err[command][-2000:])
    assert (
        json.loads(out["airflow-repl status   -t dags/demo_topology.yaml -o json"])[0]["backlog"]["transactions"] == 0
    )
    page = (work / "report.html").read_text()
    assert page.lstrip().startswith("<!DOCTYPE html>") and "reporting" in page
    assert "CREATE OR REPLACE PROCEDURE" in (work / "procs.sql").read_text()

    conflicts = out["airflow-repl conflicts        -t dags/demo_updatable_topology.yaml"].splitlines()
    assert len(conflicts) == 2 and conflicts[1].split()[1:3] == ["shop_notes", "branch_b"], conflicts
    assert "update/update" in conflicts[1]
    assert json.loads(out["airflow-repl resolve-in-doubt -t dags/demo_updatable_topology.yaml"]) == {}
    assert "yes" in out["airflow-repl validate         -t dags/demo_updatable_topology.yaml"]
    assert not (work / ".sandbox").exists()  # destroyed by the walk's last command
    assert [p.name for p in home.iterdir()] in ([], [".cache"]), list(home.rglob("*"))  # no ~/airflow
