"""The replication topology: publisher, distributor, subscribers, publications, articles and
subscriptions, loaded from a YAML file or built in Python.

Only static checks happen here (shape, names, duplicates, call syntaxes).  Checks that need the
publisher's catalog (unknown table or column, missing primary key) happen when the topology is
applied, in :mod:`airflow_repl.engine.deploy`.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import connections
from .errors import TopologyError
from .predicate import check_predicate
from .propagation import Propagation, parse_propagation

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def _check_name(kind: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise TopologyError(
            f"{kind} name {name!r} is invalid: use 1-40 lower-case letters, digits or underscores, "
            f"starting with a letter (it becomes part of slot and publication names)")
    return name


@dataclass
class Endpoint:
    """A server: an Airflow connection id or a postgresql:// URI.  ``conninfo`` is filled in by
    :meth:`Topology.resolve` and is never written to logs."""

    ref: str
    conninfo: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"Endpoint({self.display!r})"

    @property
    def display(self) -> str:
        """The reference without any password a URI may carry."""
        if not connections.is_uri(self.ref):
            return self.ref
        try:
            return connections.describe(connections.resolve(self.ref))
        except Exception:  # noqa: BLE001 - an unsupported URI is reported elsewhere
            return "<uri>"

    def require(self, role: str) -> str:
        if self.conninfo is None:
            self.conninfo = connections.resolve(self.ref)
        return self.conninfo


@dataclass
class Article:
    name: str
    source_schema: str
    source_table: str
    dest_schema: str
    dest_table: str
    #: SQL predicate on the source table (row filter); None replicates every row.
    row_filter: str | None = None
    #: Column filter: the columns replicated (the primary key is always added); None = all.
    columns: list[str] | None = None
    #: Which updates become DELETE + INSERT pairs (see UPDATE_MODES).
    updates_as_delete_insert: str = "key_changes"
    ins_cmd: Propagation = field(default_factory=lambda: parse_propagation("insert", None))
    upd_cmd: Propagation = field(default_factory=lambda: parse_propagation("update", None))
    del_cmd: Propagation = field(default_factory=lambda: parse_propagation("delete", None))

    @property
    def source(self) -> str:
        return f"{self.source_schema}.{self.source_table}"

    @property
    def destination(self) -> str:
        return f"{self.dest_schema}.{self.dest_table}"


@dataclass
class Publication:
    name: str
    articles: list[Article]

    def article(self, name: str) -> Article:
        for art in self.articles:
            if art.name == name:
                return art
        raise TopologyError(f"publication {self.name!r} has no article {name!r}")


@dataclass
class Subscription:
    publication: str
    subscriber: str
    #: Distribution Agent: transactions per subscriber commit (SQL Server's CommitBatchSize).
    commit_batch_size: int = 100
    #: Distribution Agent: commands per subscriber commit (SQL Server's CommitBatchThreshold).
    commit_batch_threshold: int = 1000
    #: Distribution Agent: parallel connections to the subscriber (SQL Server's SubscriptionStreams).
    subscription_streams: int = 1
    #: Distribution Agent: errors that skip the failing transaction (SQL Server's SkipErrors):
    #: "row_not_found" (20598) and/or "duplicate_key" (2627).
    skip_errors: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.publication}__{self.subscriber}"


@dataclass
class Topology:
    publisher: Endpoint
    distributor: Endpoint
    subscribers: dict[str, Endpoint]
    publications: dict[str, Publication]
    subscriptions: list[Subscription]
    #: Folder where the Snapshot Agent writes snapshot folders.
    snapshot_folder: str = "snapshots"

    # ------------------------------------------------------------------ lookups
    def publication(self, name: str) -> Publication:
        try:
            return self.publications[name]
        except KeyError:
            raise TopologyError(
                f"unknown publication {name!r}; the topology defines: "
                f"{', '.join(sorted(self.publications)) or 'none'}") from None

    def subscriptions_of(self, publication: str) -> list[Subscription]:
        return [s for s in self.subscriptions if s.publication == publication]

    def subscription(self, publication: str, subscriber: str) -> Subscription:
        for sub in self.subscriptions:
            if sub.publication == publication and sub.subscriber == subscriber:
                return sub
        raise TopologyError(f"no subscription of subscriber {subscriber!r} to publication {publication!r}")

    def subscriber_conninfo(self, name: str) -> str:
        return self.subscribers[name].require(f"subscriber {name}")

    # ------------------------------------------------------------------ resolution
    def resolve(self, resolver: connections.Resolver | None = None) -> "Topology":
        """Resolve every connection reference to a connection string (in place)."""
        for endpoint in [self.publisher, self.distributor, *self.subscribers.values()]:
            if endpoint.conninfo is None:
                endpoint.conninfo = connections.resolve(endpoint.ref, resolver)
        return self

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self, *, with_secrets: bool = False) -> dict[str, Any]:
        def ep(e: Endpoint) -> Any:
            if with_secrets:
                return {"ref": e.ref, "conninfo": e.require(e.ref)}
            return e.display

        return {
            "publisher": ep(self.publisher),
            "distributor": ep(self.distributor),
            "subscribers": {k: ep(v) for k, v in self.subscribers.items()},
            "snapshot_folder": self.snapshot_folder,
            "publications": [
                {"name": p.name, "articles": [
                    {"name": a.name, "table": a.source,
                     "destination": a.destination, "row_filter": a.row_filter, "columns": a.columns,
                     "updates_as_delete_insert": a.updates_as_delete_insert,
                     "ins_cmd": a.ins_cmd.text, "upd_cmd": a.upd_cmd.text, "del_cmd": a.del_cmd.text}
                    for a in p.articles]}
                for p in self.publications.values()
            ],
            "subscriptions": [asdict(s) for s in self.subscriptions],
        }


# ---------------------------------------------------------------------- loading
def _split_table(kind: str, value: Any, default_schema: str = "public") -> tuple[str, str]:
    if not isinstance(value, str) or not value.strip():
        raise TopologyError(f"{kind} must be a table name such as 'public.orders', got {value!r}")
    parts = value.split(".")
    if len(parts) == 1:
        return default_schema, parts[0]
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1]
    raise TopologyError(f"{kind} {value!r} is not of the form schema.table")


def _endpoint(kind: str, value: Any) -> Endpoint:
    if isinstance(value, dict) and "conninfo" in value:
        return Endpoint(value.get("ref", kind), value["conninfo"])
    if isinstance(value, dict):
        value = value.get("conn_id") or value.get("uri")
    if not isinstance(value, str) or not value:
        raise TopologyError(f"{kind} must be an Airflow connection id or a postgresql:// URI")
    return Endpoint(value)


_TOPOLOGY_KEYS = {"publisher", "distributor", "subscribers", "publications", "subscriptions", "snapshot_folder"}
_ARTICLE_KEYS = {"name", "table", "destination", "ins_cmd", "upd_cmd", "del_cmd", "row_filter", "columns",
                 "updates_as_delete_insert"}
_PUBLICATION_KEYS = {"name", "articles", "updates_as_delete_insert"}

#: ``updates_as_delete_insert`` values: updates that change a primary-key or unique column
#: (the default); every update (SQL Server trace flag 8202); or key changes except when the
#: transaction changed a single row of the article, which stays one UPDATE (trace flag 8207).
UPDATE_MODES = ("key_changes", "all", "multi_row_key_changes")


def _update_mode(value: Any, where: str) -> str:
    if value not in UPDATE_MODES:
        raise TopologyError(f"updates_as_delete_insert of {where} is {value!r}; choose one of "
                            f"{', '.join(UPDATE_MODES)}")
    return value


def _columns(value: Any, article: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise TopologyError(f"columns of article {article!r} must be a non-empty list of column names")
    if len(set(value)) != len(value):
        raise TopologyError(f"columns of article {article!r} lists a column twice")
    return list(value)
_SUBSCRIPTION_KEYS = {"publication", "subscriber", "commit_batch_size", "commit_batch_threshold",
                      "subscription_streams", "skip_errors"}
#: SkipErrors names (and SQL Server's error numbers) -> SQLSTATE.
SKIPPABLE_ERRORS = {"row_not_found": "RP598", "20598": "RP598", "duplicate_key": "23505", "2627": "23505"}


def from_dict(data: dict[str, Any]) -> Topology:
    """Build and statically check a topology from its dictionary (YAML) form."""
    if not isinstance(data, dict):
        raise TopologyError("a topology must be a mapping with publisher, distributor, subscribers, "
                            "publications and subscriptions")
    for key in ("publisher", "distributor", "publications"):
        if key not in data:
            raise TopologyError(f"the topology has no {key!r} entry")
    unknown = set(data) - _TOPOLOGY_KEYS
    if unknown:
        raise TopologyError(f"the topology has unknown entries {sorted(unknown)}; known entries: "
                            f"{sorted(_TOPOLOGY_KEYS)}")
    subscribers = {_check_name("subscriber", k): _endpoint(f"subscriber {k!r}", v)
                   for k, v in (data.get("subscribers") or {}).items()}
    publications: dict[str, Publication] = {}
    for pdata in data["publications"] or []:
        pname = _check_name("publication", (pdata or {}).get("name"))
        unknown = set(pdata) - _PUBLICATION_KEYS
        if unknown:
            raise TopologyError(f"publication {pname!r} has unknown option(s) {sorted(unknown)}; known "
                                f"options: {sorted(_PUBLICATION_KEYS)}")
        pub_mode = _update_mode(pdata.get("updates_as_delete_insert", "key_changes"), f"publication {pname!r}")
        if pname in publications:
            raise TopologyError(f"publication {pname!r} is defined twice")
        articles: list[Article] = []
        seen_names: set[str] = set()
        seen_sources: set[str] = set()
        seen_dests: set[str] = set()
        for adata in pdata.get("articles") or []:
            if isinstance(adata, str):
                adata = {"table": adata}
            unknown = set(adata) - _ARTICLE_KEYS
            if unknown:
                raise TopologyError(
                    f"article {adata.get('name') or adata.get('table')!r} in publication {pname!r} has "
                    f"unknown option(s) {sorted(unknown)}; known options: {sorted(_ARTICLE_KEYS)}")
            schema, table = _split_table(f"article table in publication {pname!r}", adata.get("table"))
            name = adata.get("name") or table
            dschema, dtable = _split_table(f"destination of article {name!r}",
                                           adata.get("destination") or f"{schema}.{table}", schema)
            if name in seen_names:
                raise TopologyError(f"duplicate article {name!r} in publication {pname!r}: "
                                    f"give each article a distinct name")
            if f"{schema}.{table}" in seen_sources:
                raise TopologyError(f"duplicate article: table {schema}.{table} is published twice "
                                    f"in publication {pname!r}")
            if f"{dschema}.{dtable}" in seen_dests:
                raise TopologyError(f"duplicate article destination {dschema}.{dtable} in publication "
                                    f"{pname!r}: two articles would write the same subscriber table")
            seen_names.add(name)
            seen_sources.add(f"{schema}.{table}")
            seen_dests.add(f"{dschema}.{dtable}")
            row_filter = adata.get("row_filter")
            art = Article(name, schema, table, dschema, dtable,
                          row_filter=None if row_filter is None else check_predicate(row_filter, article=name),
                          columns=_columns(adata.get("columns"), name),
                          updates_as_delete_insert=_update_mode(
                              adata.get("updates_as_delete_insert", pub_mode), f"article {name!r}"),
                          ins_cmd=parse_propagation("insert", adata.get("ins_cmd"), article=name),
                          upd_cmd=parse_propagation("update", adata.get("upd_cmd"), article=name),
                          del_cmd=parse_propagation("delete", adata.get("del_cmd"), article=name))
            articles.append(art)
        if not articles:
            raise TopologyError(f"publication {pname!r} has no articles")
        publications[pname] = Publication(pname, articles)
    subscriptions: list[Subscription] = []
    for sdata in data.get("subscriptions") or []:
        unknown = set(sdata) - _SUBSCRIPTION_KEYS
        if unknown:
            raise TopologyError(f"subscription {sdata} has unknown option(s) {sorted(unknown)}; "
                                f"known options: {sorted(_SUBSCRIPTION_KEYS)}")
        pub, subr = sdata.get("publication"), sdata.get("subscriber")
        if pub not in publications:
            raise TopologyError(f"subscription names unknown publication {pub!r}")
        if subr not in subscribers:
            raise TopologyError(f"subscription to {pub!r} names unknown subscriber {subr!r}; "
                                f"define it under 'subscribers'")
        if any(s.publication == pub and s.subscriber == subr for s in subscriptions):
            raise TopologyError(f"subscriber {subr!r} subscribes to publication {pub!r} twice")
        sub = Subscription(pub, subr)
        skip = sdata.get("skip_errors", [])
        if not isinstance(skip, list) or any(str(e) not in SKIPPABLE_ERRORS for e in skip):
            raise TopologyError(f"skip_errors of subscription {pub}/{subr} must list some of: "
                                f"row_not_found (20598), duplicate_key (2627); got {skip!r}")
        sub.skip_errors = [str(e) for e in skip]
        for key in ("commit_batch_size", "commit_batch_threshold", "subscription_streams"):
            if key in sdata:
                value = sdata[key]
                if not isinstance(value, int) or value < 1:
                    raise TopologyError(f"{key} of subscription {pub}/{subr} must be a positive integer")
                setattr(sub, key, value)
        subscriptions.append(sub)
    return Topology(
        publisher=_endpoint("publisher", data["publisher"]),
        distributor=_endpoint("distributor", data["distributor"]),
        subscribers=subscribers,
        publications=publications,
        subscriptions=subscriptions,
        snapshot_folder=expand_env(str(data.get("snapshot_folder") or "snapshots"), "snapshot_folder"),
    )


_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: str, what: str) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}``; an unset variable without default is an error."""
    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise TopologyError(f"{what} uses ${{{name}}}, which is not set: set it or give a default "
                            f"with ${{{name}:-value}}")
    return _VAR_RE.sub(sub, value)


def load(path: str | Path) -> Topology:
    """Load a topology YAML file.  ``snapshot_folder`` may use ``${VAR:-default}``; a relative
    one is relative to the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise TopologyError(f"topology file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise TopologyError(f"topology file {path} is not valid YAML: {exc}") from None
    topo = from_dict(data)
    folder = Path(topo.snapshot_folder).expanduser()
    topo.snapshot_folder = str(folder if folder.is_absolute() else (path.parent / folder).resolve())
    return topo
