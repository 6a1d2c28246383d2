"""Which Spark executor runs a task, as the agents' summaries report it.

PySpark gives a Python task no executor id, so :func:`executor_id` reads what each cluster
manager puts in the executor's environment (inherited by its Python workers): Kubernetes sets
``SPARK_EXECUTOR_ID``; a standalone worker sets ``SPARK_LOG_URL_STDERR`` to the executor's
log page, whose ``executorId`` parameter is the id; YARN sets ``CONTAINER_ID``.  A task of a
local-mode application runs in the driver.
"""

from __future__ import annotations

import os
import re
import socket

_LOG_URL_ID = re.compile(r"[?&]executorId=([^&]+)")


def executor_id() -> str:
    """Executor side: ``"<host>/<executor id>"`` of the executor running the current task
    (``"<host>/driver"`` in local mode, where tasks run in the driver)."""
    ident = os.environ.get("SPARK_EXECUTOR_ID")
    if not ident:
        found = _LOG_URL_ID.search(os.environ.get("SPARK_LOG_URL_STDERR", ""))
        ident = found.group(1) if found else os.environ.get("CONTAINER_ID")
    return f"{socket.gethostname()}/{ident or 'driver'}"
