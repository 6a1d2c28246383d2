"""Scripts that regenerate an article's custom procedures at the subscribers after a schema
change (SQL Server's ``sp_register_custom_scripting``): ``airflow-repl register-script``.

A script is a SQL template, whose ``{{key}}`` placeholders are replaced by quoted names
(:data:`~airflow_repl.engine.subscriber.schema_changes.TEMPLATE_KEYS`), or a Python function named
``module:function``, called as ``function(connection, article_definition, subscriber)``.  The
Distribution Agent runs it at each subscriber in the transaction that applies the change.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model.ddl import SCRIPT_PLACEHOLDERS as TEMPLATE_KEYS
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.state import dist_publications, dist_schema

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_]+)\s*\}\}")
_PYTHON = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def check_script(kind: str, body: str, *, where: str = "script") -> None:
    """A script is registered only when it can run: known placeholders, an importable function."""
    if kind == "sql":
        unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(body)} - set(TEMPLATE_KEYS))
        if unknown:
            raise TopologyError(
                f"{where}: unknown placeholder(s) {unknown}; use {{{{{'}}, {{'.join(TEMPLATE_KEYS)}}}}}"
            )
        if not body.strip():
            raise TopologyError(f"{where}: the SQL script is empty")
        return
    if kind != "python":
        raise TopologyError(f"{where}: kind {kind!r} is not 'sql' or 'python'")
    if not _PYTHON.match(body):
        raise TopologyError(f"{where}: {body!r} is not 'module:function'")
    module, _, name = body.partition(":")
    try:
        func = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise TopologyError(f"{where}: {body!r} cannot be imported here ({exc})") from None
    if not callable(func):
        raise TopologyError(f"{where}: {body!r} is not a function")


def register_script(topology: Topology, publication: str, article: str, kind: str, body: str) -> dict[str, Any]:
    """Register (or replace) the script of ``article``; checked before anything is stored."""
    pub = topology.publication(publication)
    if article not in {a.name for a in pub.articles}:
        raise TopologyError(f"publication {publication!r} has no article {article!r}")
    check_script(kind, body, where=f"script of article {article!r}")
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        dist_schema.ensure_schema(dist)
        with dist.transaction():
            dist_publications.save_custom_script(dist, publication, article, kind, body)
    return {"publication": publication, "article": article, "kind": kind}


def unregister_script(topology: Topology, publication: str, article: str) -> dict[str, Any]:
    topology.publication(publication)
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        dist_schema.ensure_schema(dist)
        with dist.transaction():
            found = dist_publications.drop_custom_script(dist, publication, article)
    if not found:
        raise TopologyError(f"article {article!r} of publication {publication!r} has no registered script")
    return {"publication": publication, "article": article, "dropped": True}
