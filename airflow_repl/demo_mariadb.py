"""The demo's MariaDB part (``make demo``): the demo publication ``shop`` to a MariaDB subscriber
beside the PostgreSQL one.

The sandbox's private MariaDB server is started (its own data directory, the unprivileged user,
127.0.0.1, the password in the sandbox's 0600 file) with a database ``shop_maria``, named by the
Airflow ``mysql`` connection ``repl_mariadb`` (``AIRFLOW_CONN_REPL_MARIADB``).  The demo topology
(``dags/demo_topology.yaml``) with that subscriber and its subscription added is written to the
sandbox (:data:`TOPOLOGY_FILE`); the Snapshot Agent initializes only the new subscription (the
PostgreSQL subscriber stays as it is), a burst of changes is written at the publisher (updates,
deletes, 4-byte UTF-8 and a key change), and one Log Reader and Distribution Agent run delivers it
to the MariaDB subscriber.  Prints each article's row counts and checksums at the publisher and the MariaDB
subscriber (by canonical value, :mod:`~airflow_repl.engine.subscriber.mariadb_validation`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SUBSCRIBER = "maria"
CONNECTION_ID = "repl_mariadb"
DATABASE = "shop_maria"
TOPOLOGY_FILE = "demo_mariadb_topology.yaml"


def topology_text(base: str) -> str:
    """The demo topology ``base`` (YAML text) with the MariaDB subscriber and its subscription."""
    import yaml

    data = yaml.safe_load(base)
    data["subscribers"][SUBSCRIBER] = CONNECTION_ID
    data["subscriptions"].append(
        {"publication": "shop", "subscriber": SUBSCRIBER, "commit_batch_size": 100, "commit_batch_threshold": 5000}
    )
    return yaml.safe_dump(data, sort_keys=False)


def start_server(root: Path) -> str:
    """The sandbox's MariaDB server started and the demo's database created anew; the Airflow
    connection's environment variable set.  Returns the connection's URI."""
    from airflow_repl.sandbox import Sandbox

    server = Sandbox(root).mariadb()
    server.start()
    server.create_database(DATABASE, recreate=True)
    uri = server.uri(DATABASE).replace("mariadb://", "mysql://", 1)
    os.environ[f"AIRFLOW_CONN_{CONNECTION_ID.upper()}"] = uri
    return uri


def _cli(*args: str) -> None:
    done = subprocess.run(["airflow-repl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"airflow-repl {args[0]} failed (exit code {done.returncode})")


def changes(publisher: str) -> None:
    """A burst at the publisher: updates, inserts, a delete and a key change."""
    import psycopg

    with psycopg.connect(publisher) as conn:
        conn.execute("UPDATE orders SET status = 'shipped' WHERE id % 7 = 0")
        conn.execute("UPDATE orders SET note = NULL WHERE id % 17 = 0")
        conn.execute("UPDATE customers SET name = name || ' \U0001f600' WHERE id % 11 = 0")
        conn.execute("DELETE FROM orders WHERE id % 13 = 0")  # and their lines (ON DELETE CASCADE)
        conn.execute("UPDATE products SET sku = sku || '-v2' WHERE sku = (SELECT min(sku) FROM products)")


def report(topology: Any) -> bool:
    """Each article's rows and checksums at the publisher and the MariaDB subscriber, printed."""
    from airflow_repl.engine.subscriber import validation

    rows = validation.compare(topology, "shop", SUBSCRIBER)
    print(f"  {'article':<14} {'pub rows':>9} {'maria rows':>10}  {'pub checksum':<34} {'maria checksum':<34} match")
    for r in rows:
        print(
            f"  {r['article']:<14} {r['publisher_rows']:>9} {r['subscriber_rows']:>10}  "
            f"{r['publisher_checksum']!s:<34} {r['subscriber_checksum']!s:<34} {'yes' if r['match'] else 'NO'}"
        )
    return all(r["match"] for r in rows)


def run(demo: Any, conninfos: dict[str, str], root: Path) -> bool:
    """This part of the demo, printed; True when the MariaDB subscriber equals the publisher."""
    from airflow_repl.engine.errors import ReplError
    from airflow_repl.hooks.connections import load_topology

    demo._say(f"a MariaDB subscriber: publication shop to MariaDB subscriber {SUBSCRIBER!r} beside 'reporting'")
    try:
        start_server(root)
    except ReplError as exc:  # no mariadb-server on this machine: said, not failed
        print(f"  skipped: {exc}", flush=True)
        return True
    path = root / TOPOLOGY_FILE
    path.write_text(topology_text((demo.DAGS / "demo_topology.yaml").read_text()))
    os.chmod(path, 0o600)
    topo = ["-t", str(path), "-p", "shop"]
    _cli("snapshot", *topo, "--subscriber", SUBSCRIBER)
    print("  snapshot taken (the PostgreSQL subscriber left as it is); a burst of changes at the publisher")
    changes(conninfos["publisher"])
    _cli("logreader", *topo)
    _cli("distribution", *topo, "--subscriber", SUBSCRIBER)
    print("  log reader and distribution ran; publisher vs MariaDB subscriber:", flush=True)
    return report(load_topology(path))
