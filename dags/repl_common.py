"""Settings shared by the example DAGs (environment variables with sensible defaults)."""

from __future__ import annotations

import os
from pathlib import Path

TOPOLOGY = os.environ.get("AIRFLOW_REPL_TOPOLOGY", str(Path(__file__).with_name("demo_topology.yaml")))
PUBLICATION = os.environ.get("AIRFLOW_REPL_PUBLICATION", "shop")
SPARK_CONN_ID = os.environ.get("AIRFLOW_REPL_SPARK_CONN_ID", "spark_default")
