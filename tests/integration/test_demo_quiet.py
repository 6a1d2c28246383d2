"""The demo's console: Airflow's notes about the assets of dag.test() runs stay out of it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from airflow_repl import demo

    conninfos = {
        role: f"host=127.0.0.1 port=5432 dbname={role} user=postgres"
        for role in ("publisher", "distributor", "subscriber")
    }
    demo.prepare_environment(Path(sys.argv[1]), conninfos)
    import airflow.settings  # noqa: F401  (configures Airflow's logging from the environment)
    from airflow.assets.manager import AssetManager

    log = AssetManager().log
    log.warning("AssetModel of the demo not found; cannot create asset event")
    log.error("an asset error still shows")
    """
)


def test_dag_test_asset_warnings_are_not_printed(tmp_path) -> None:
    # dag.test() registers no asset: every asset event of the example DAGs' outlets logged two
    # warnings per table (about 40 long lines in one demo) from airflow.assets.manager
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "an asset error still shows" in output
    assert "cannot create asset event" not in output
