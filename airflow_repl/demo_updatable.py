"""The demo's last part: queued updating subscriptions (``make demo``).

A second publication, ``shop_notes`` (table ``store_notes`` of the shop, ``allow_queued_tran``,
``pub wins``), goes to two queued subscribers, ``branch_a`` and ``branch_b`` (topology
``dags/demo_updatable_topology.yaml``).  After its snapshot (``airflow-repl snapshot``), branch_a
changes one note, and branch_b and the publisher change another (a conflict); one run of the
example DAG ``airflow_repl_updatable`` (queue reader -> log reader -> distribution, spark-submitted
by Airflow) brings branch_a's change to the publisher and to branch_b, resolves the conflict
(publisher wins) and leaves the three databases equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any

PUBLICATION = "shop_notes"
BRANCHES = ("branch_a", "branch_b")
TOPOLOGY_FILE = "demo_updatable_topology.yaml"


def connection_ids(conninfos: dict[str, str]) -> dict[str, str]:
    """The Airflow connections of the branches (``AIRFLOW_CONN_REPL_BRANCH_A`` ...)."""
    from airflow_repl.engine.postgres.connections import to_uri

    return {f"AIRFLOW_CONN_REPL_{b.upper()}": to_uri(conninfos[b]) for b in BRANCHES if b in conninfos}


def create_notes(publisher: str) -> None:
    """The published table ``store_notes`` with its three notes, at the publisher."""
    _run(
        publisher,
        "CREATE TABLE store_notes (id int PRIMARY KEY, note text NOT NULL)",
        "INSERT INTO store_notes VALUES (1, 'open 9-17'), (2, 'closed on Sunday'), (3, 'parking at the back')",
    )


def _run(conninfo: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(conninfo) as conn:
        for statement in statements:
            conn.execute(statement)


def _notes(conninfo: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute("SELECT id, note, msrepl_tran_version::text FROM store_notes ORDER BY id").fetchall()


def _load_updatable_dag(demo: Any, topology: str) -> Any:
    """The example DAG, reading this part's topology and publication (``repl_common`` reads
    them from the environment when it is imported)."""
    saved = {k: os.environ.get(k) for k in ("AIRFLOW_REPL_TOPOLOGY", "AIRFLOW_REPL_UPDATABLE_PUBLICATION")}
    os.environ.update({"AIRFLOW_REPL_TOPOLOGY": topology, "AIRFLOW_REPL_UPDATABLE_PUBLICATION": PUBLICATION})
    sys.modules.pop("repl_common", None)
    try:
        return demo.load_dag("repl_updatable.py")
    finally:
        sys.modules.pop("repl_common", None)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(demo: Any, conninfos: dict[str, str]) -> bool:
    """This part of the demo, printed; True when its checks hold."""
    from airflow_repl.engine.postgres import connections
    from airflow_repl.engine.state import dist_conflicts
    from airflow_repl.engine.subscriber import validation
    from airflow_repl.hooks.connections import load_topology

    path = str(demo.DAGS / TOPOLOGY_FILE)
    pub, dist = conninfos["publisher"], conninfos["distributor"]
    demo._say(f"updatable subscriptions: publication {PUBLICATION} (queued updating, pub wins) to branch_a, branch_b")
    create_notes(pub)
    snap = subprocess.run(["airflow-repl", "snapshot", "-t", path, "-p", PUBLICATION], capture_output=True, text=True)
    if snap.returncode != 0:
        print(snap.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"airflow-repl snapshot of {PUBLICATION} failed (exit code {snap.returncode})")
    print("  snapshot taken; branch_a changes note 1; branch_b and the publisher both change note 2", flush=True)
    _run(conninfos["branch_a"], "UPDATE store_notes SET note = 'open 8-18 (branch_a)' WHERE id = 1")
    _run(conninfos["branch_b"], "UPDATE store_notes SET note = 'closed on Monday (branch_b)' WHERE id = 2")
    _run(pub, "UPDATE store_notes SET note = 'closed on Sunday and Monday (publisher)' WHERE id = 2")
    demo._say("DAG airflow_repl_updatable (queue reader -> log reader -> distribution)")
    demo.run_dag(_load_updatable_dag(demo, path), demo.current_interval_start(datetime.now(timezone.utc)))
    rows = {name: _notes(conninfos[name]) for name in ("publisher", *BRANCHES)}
    for name, found in rows.items():
        print(f"  {name:<10} " + "; ".join(f"{i}: {note}" for i, note, _ in found))
    with connections.connect(dist, "distributor") as conn:
        found_conflicts = dist_conflicts.list_conflicts(conn, publication=PUBLICATION)
    for c in found_conflicts:
        print(
            f"  conflict at {c['subscriber']}: {c['kind']} on {c['article']} {c['key']} ({c['policy']}): {c['outcome']}"
        )
    topo = load_topology(path)
    report = [r for b in BRANCHES for r in validation.compare(topo, PUBLICATION, b)]
    ok = (
        rows["publisher"] == rows["branch_a"] == rows["branch_b"]
        and rows["publisher"][0][1] == "open 8-18 (branch_a)"
        and [(c["subscriber"], c["kind"]) for c in found_conflicts] == [("branch_b", "update/update")]
        and all(r["match"] for r in report)
    )
    print(
        "  branch_a's change reached the publisher and branch_b; one conflict, the publisher won; all three equal"
        if ok
        else "  MISMATCH in the updatable subscriptions",
        flush=True,
    )
    return ok
