"""Settings shared by the example DAGs (environment variables with sensible defaults)."""

from __future__ import annotations

import os
from pathlib import Path

TOPOLOGY = os.environ.get("AIRFLOW_REPL_TOPOLOGY", str(Path(__file__).with_name("demo_topology.yaml")))
PUBLICATION = os.environ.get("AIRFLOW_REPL_PUBLICATION", "shop")
SPARK_CONN_ID = os.environ.get("AIRFLOW_REPL_SPARK_CONN_ID", "spark_default")
#: The publication with queued updating subscriptions (repl_updatable.py, repl_updatable_continuous.py).
UPDATABLE_PUBLICATION = os.environ.get("AIRFLOW_REPL_UPDATABLE_PUBLICATION", PUBLICATION)
#: The subscriber table the asset-scheduled example DAG (repl_on_replicated_table.py) waits for,
#: as its Postgres asset URI: postgres://host:port/database/schema/table, with the host, port and
#: database of the subscriber's connection as written there (see docs/assets-and-lineage.md).
REPLICATED_ORDERS = os.environ.get("AIRFLOW_REPL_ORDERS_ASSET", "postgres://localhost:5432/reporting/public/orders")
