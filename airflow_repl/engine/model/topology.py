"""The replication topology: publisher, distributor, subscribers, publications, articles and
subscriptions, loaded from a YAML file or built in Python.

One pydantic model (:class:`TopologyModel` and the classes it holds) describes the file: every
field is typed strictly (no ``true`` for 1, no ``"5"`` for 5), integers have ranges, unknown keys
are errors at every level, and names are checked against PostgreSQL's rules (63 bytes).  An
invalid topology raises one :class:`~airflow_repl.engine.errors.TopologyError` line naming the
YAML path and, for a file, its line and column::

    topology file t.yaml:12:7: publications[0].articles[1].row_filter: <what is wrong>; <the fix>

Only static checks happen here.  Checks that need the publisher's catalog (unknown table or
column, missing primary key) happen when the topology is applied, in
:mod:`airflow_repl.engine.provisioning.deploy`.
"""

from __future__ import annotations

import difflib
import os
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin
from urllib.parse import unquote, urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    InstanceOf,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import naming, yaml_source
from airflow_repl.engine.model.propagation import Operation, Propagation, parse_propagation
from airflow_repl.engine.model.row_filters import check_predicate
from airflow_repl.engine.model.updating import ConflictPolicy, UpdateMode, parse_conflict_policy, parse_update_mode
from airflow_repl.engine.model.yaml_source import Loc, Source, format_loc

#: PostgreSQL's identifier limit (NAMEDATALEN - 1), in bytes of the database encoding (UTF-8).
MAX_IDENTIFIER_BYTES = 63

_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")
#: Airflow's own rule for connection ids (airflow.models.connection.RE_SANITIZE_CONN_ID).
_CONN_ID_RE = re.compile(r"[\w#!()\-.:/\\]{1,250}")

DeleteInsertMode = Literal["key_changes", "all", "multi_row_key_changes"]
#: ``updates_as_delete_insert`` values: updates that change a primary-key or unique column
#: (the default); every update (SQL Server trace flag 8202); or key changes except when the
#: transaction changed a single row of the article, which stays one UPDATE (trace flag 8207).
UPDATE_MODES: tuple[str, ...] = get_args(DeleteInsertMode)
#: How the Distribution Agent applies a batch (docs/topology.md): ``auto`` (net change for the
#: articles where nothing at the subscriber can tell it apart, command by command elsewhere),
#: ``per_command`` (every command as it came) or ``net_change`` (net change wherever it applies).
ApplyMode = Literal["auto", "per_command", "net_change"]

#: SkipErrors names (and SQL Server's error numbers) -> SQLSTATE.
SKIPPABLE_ERRORS = {"row_not_found": "RP598", "20598": "RP598", "duplicate_key": "23505", "2627": "23505"}

#: Allowed ranges of the subscription options (inclusive).
RANGES: dict[str, tuple[int, int]] = {
    "commit_batch_size": (1, 1_000_000),
    "commit_batch_threshold": (1, 10_000_000),
    "subscription_streams": (1, 64),
}


# ---------------------------------------------------------------------- building blocks
def _error(message: str, at: Loc = ()) -> PydanticCustomError:
    """A validation error whose message is used as it is; ``at`` extends the error's path
    (a model-level check pointing at one field of one list entry)."""
    return PydanticCustomError("topology", "{message}", {"message": message, "at": at})


def _check_name(kind: str, name: str) -> str:
    """Publication and subscriber names: they become parts of slot and publication names."""
    if not _NAME_RE.fullmatch(name):
        raise _error(
            f"{kind} name {name!r} is invalid: use 1-40 lower-case letters, digits or underscores, "
            f"starting with a letter (it becomes part of slot and publication names)"
        )
    if kind == "publication":
        for generated in (naming.pg_publication(name), naming.slot(name, "")):
            if len(generated.encode()) > MAX_IDENTIFIER_BYTES:
                raise _error(
                    f"publication name {name!r} makes the server object name {generated!r} longer than "
                    f"{MAX_IDENTIFIER_BYTES} bytes: choose a shorter name"
                )
    return name


def _check_identifier(kind: str, value: str) -> str:
    """A schema, table or column name: used exactly as written (a quoted identifier)."""
    if not value:
        raise _error(f"{kind} is empty: give a name")
    if "\x00" in value:
        raise _error(f"{kind} {value!r} contains a NUL character, which PostgreSQL names cannot hold: remove it")
    size = len(value.encode())
    if size > MAX_IDENTIFIER_BYTES:
        raise _error(
            f"{kind} {value!r} is {size} bytes long; PostgreSQL keeps only the first "
            f"{MAX_IDENTIFIER_BYTES} bytes of a name (in UTF-8), so it would silently refer to another "
            f"object: use a name of at most {MAX_IDENTIFIER_BYTES} bytes"
        )
    return value


def _split_table(option: str, value: str, default_schema: str) -> tuple[str, str]:
    """``schema.table`` or ``table`` (in ``default_schema``), each part checked; ``option`` is
    ``table`` or ``destination``."""
    parts = value.split(".")
    if len(parts) > 2:
        raise _error(
            f"{option} {value!r} is not of the form schema.table (names cannot contain '.'): "
            f"write schema.table or table"
        )
    schema, table = parts if len(parts) == 2 else (default_schema, parts[0])
    prefix = "" if option == "table" else f"{option} "
    return _check_identifier(f"{prefix}schema name", schema), _check_identifier(f"{prefix}table name", table)


def _named(kind: str) -> Callable[[str], str]:
    return lambda value: _check_name(kind, value)


def _identifier(kind: str) -> Callable[[str], str]:
    return lambda value: _check_identifier(kind, value)


PublicationName = Annotated[str, AfterValidator(_named("publication"))]
SubscriberName = Annotated[str, AfterValidator(_named("subscriber"))]
ColumnName = Annotated[str, AfterValidator(_identifier("column name"))]
SkipError = Annotated[Literal["row_not_found", "duplicate_key", "20598", "2627", 20598, 2627], AfterValidator(str)]


def _range(option: str) -> Any:
    """The ``Field`` bounding an integer option to its range in :data:`RANGES`."""
    low, high = RANGES[option]
    return Field(ge=low, le=high)


BatchSize = Annotated[int, _range("commit_batch_size")]
BatchThreshold = Annotated[int, _range("commit_batch_threshold")]
Streams = Annotated[int, _range("subscription_streams")]


class _Model(BaseModel):
    """Strict types (no bool for int, no str for int), unknown keys rejected."""

    model_config = ConfigDict(strict=True, extra="forbid", hide_input_in_errors=True)

    #: Keys not to offer in "known keys" hints (internal forms).
    _hidden_keys: ClassVar[frozenset[str]] = frozenset()


# ---------------------------------------------------------------------- servers
#: Turns a server reference (connection id or URI) into a libpq connection string; the model
#: never connects, so the PostgreSQL layer supplies it (``connections.resolve_topology``).
Resolver = Callable[[str], str]


def is_uri(ref: str) -> bool:
    return "://" in ref


#: URI schemes of MariaDB (and MySQL) servers: subscribers only (docs/subscribers-mariadb.md).
MARIADB_SCHEMES = ("mariadb", "mysql")


def is_mariadb(ref_or_conninfo: str) -> bool:
    """Whether a server reference or resolved connection string names a MariaDB (MySQL) server."""
    return is_uri(ref_or_conninfo) and ref_or_conninfo.split("://", 1)[0].lower() in MARIADB_SCHEMES


def _check_reference(ref: str) -> str:
    """A connection id (Airflow's rule) or a URI of a supported scheme; never quotes the value,
    which may carry a password."""
    if is_uri(ref):
        try:
            scheme = urlsplit(ref).scheme
        except ValueError:
            scheme = "?"
        if scheme not in ("postgresql", "postgres", *MARIADB_SCHEMES):
            raise _error(
                f"connection URI scheme {scheme!r} is not supported: use postgresql://user@host:port/dbname "
                f"(or, for a MariaDB subscriber, mariadb://user@host:port/database)"
            )
    elif not _CONN_ID_RE.fullmatch(ref):
        raise _error(
            "the server reference is not a valid Airflow connection id (1-250 letters, digits or _ # ! ( ) - . : / \\) "
            "nor a postgresql:// URI: fix the server reference"
        )
    return ref


class Endpoint(_Model):
    """A server: an Airflow connection id or a postgresql:// URI, written as a string or as
    ``{conn_id: ...}`` / ``{uri: ...}``.  ``conninfo`` is filled in by :meth:`Topology.resolve`
    and is never written to logs (the agents' spec file holds ``{ref, conninfo}``)."""

    _hidden_keys: ClassVar[frozenset[str]] = frozenset({"ref", "conninfo"})

    ref: str = Field(validation_alias=AliasChoices("conn_id", "uri", "ref"))
    conninfo: str | None = Field(default=None, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _forms(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"ref": _check_reference(value)}
        if isinstance(value, dict):
            return value
        raise _error(
            "a server must be an Airflow connection id or a postgresql:// URI (a string), or a mapping "
            "with conn_id or uri"
        )

    @field_validator("ref")
    @classmethod
    def _reference(cls, ref: str) -> str:
        return _check_reference(ref)

    def __repr__(self) -> str:
        return f"Endpoint({self.display!r})"

    __str__ = __repr__

    @property
    def display(self) -> str:
        """The reference without any password a URI may carry (``user@host:port/dbname``)."""
        if not is_uri(self.ref):
            return self.ref
        try:
            uri = urlsplit(self.ref)
            default_port = 3306 if is_mariadb(self.ref) else 5432
            user, host, port = unquote(uri.username or ""), uri.hostname or "localhost", uri.port or default_port
        except ValueError:
            return "<uri>"
        return f"{user}@{host}:{port}/{unquote(uri.path.lstrip('/'))}".lstrip("@")

    def require(self, role: str) -> str:
        """The resolved connection string; the topology must have been resolved first
        (:meth:`Topology.resolve`, or ``connections.resolve_topology``)."""
        if self.conninfo is None:
            raise TopologyError(
                f"{role}: the server {self.display} has not been resolved to a connection string: "
                f"resolve the topology before connecting"
            )
        return self.conninfo


# ---------------------------------------------------------------------- articles
def _article_label(info: ValidationInfo) -> str:
    """The article's name for messages, from the fields validated so far."""
    if info.data.get("name"):
        return str(info.data["name"])
    table = info.data.get("table")
    return table.split(".", 1)[1] if table else "?"


class Article(_Model):
    """One published table.  Written as a string (the table) or a mapping."""

    #: Source table at the publisher: ``schema.table`` or ``table`` (schema ``public``);
    #: after validation always ``schema.table``.
    table: str
    #: Article name, unique within the publication (default, written as "": the table part of ``table``).
    name: str = ""
    #: Table at the subscribers (default: the source's ``schema.table``; a bare name takes the
    #: source's schema; "" is the default); after validation always ``schema.table``.
    destination: str = ""
    #: SQL predicate on the source table (row filter); None replicates every row.
    row_filter: str | None = None
    #: Column filter: the columns replicated (the primary key is always added); None = all.
    columns: Annotated[list[ColumnName], Field(min_length=1)] | None = None
    #: Which updates become DELETE + INSERT pairs (see UPDATE_MODES); when not given, the
    #: publication's value.
    updates_as_delete_insert: DeleteInsertMode = "key_changes"
    ins_cmd: InstanceOf[Propagation] = Field(default_factory=lambda: parse_propagation(Operation.INSERT, None))
    upd_cmd: InstanceOf[Propagation] = Field(default_factory=lambda: parse_propagation(Operation.UPDATE, None))
    del_cmd: InstanceOf[Propagation] = Field(default_factory=lambda: parse_propagation(Operation.DELETE, None))
    #: Publish the table's inheritance children too (PostgreSQL's ``ONLY`` vs. ``*``).
    include_children: bool = False

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"table": value}
        if isinstance(value, dict):
            return value
        raise _error("an article must be a table name (schema.table) or a mapping with 'table:' and its options")

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        return ".".join(_split_table("table", value, "public"))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        _check_identifier("article name", value)
        if "/" in value or "\\" in value or value in (".", ".."):
            raise _error(f"article name {value!r} names a folder of snapshot files: use no '/', '\\', '.' or '..'")
        return value

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: str, info: ValidationInfo) -> str:
        source = info.data.get("table")
        return ".".join(_split_table("destination", value, source.split(".", 1)[0] if source else "public"))

    @field_validator("row_filter")
    @classmethod
    def _row_filter(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        try:
            return check_predicate(value, article=_article_label(info))
        except TopologyError as exc:
            raise _error(str(exc)) from None

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            first: dict[str, int] = {}
            for index, column in enumerate(value):
                if column in first:
                    raise _error(
                        f"column {column!r} is listed twice (entries {first[column]} and {index}): "
                        f"list each column once",
                        at=(index,),
                    )
                first[column] = index
        return value

    @field_validator("ins_cmd", "upd_cmd", "del_cmd", mode="before")
    @classmethod
    def _propagation(cls, value: Any, info: ValidationInfo) -> Propagation:
        if isinstance(value, Propagation):
            return value
        operation = next(op for op in Operation if op.option == info.field_name)
        try:
            return parse_propagation(operation, value, article=_article_label(info))
        except TopologyError as exc:
            raise _error(str(exc)) from None

    @model_validator(mode="after")
    def _defaults(self) -> Article:
        if not self.name:
            self.name = self.source_table
        if not self.destination:
            self.destination = self.table
        return self

    @property
    def source_schema(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def source_table(self) -> str:
        return self.table.split(".", 1)[1]

    @property
    def dest_schema(self) -> str:
        return self.destination.split(".", 1)[0]

    @property
    def dest_table(self) -> str:
        return self.destination.split(".", 1)[1]

    @property
    def source(self) -> str:
        return self.table

    def to_dict(self) -> dict[str, Any]:
        """The article in the topology file's form, every option written out."""
        return {
            "name": self.name,
            "table": self.source,
            "destination": self.destination,
            "row_filter": self.row_filter,
            "columns": self.columns,
            "updates_as_delete_insert": self.updates_as_delete_insert,
            "ins_cmd": self.ins_cmd.text,
            "upd_cmd": self.upd_cmd.text,
            "del_cmd": self.del_cmd.text,
            "include_children": self.include_children,
        }


# ---------------------------------------------------------------------- monitoring thresholds
#: The monitoring thresholds (docs/monitoring.md), keys of a publication and, overriding it, of
#: a subscription; ``airflow-repl status --check`` compares each subscription with them.
THRESHOLD_KEYS = (
    "warn_latency_seconds",
    "critical_latency_seconds",
    "warn_pending_commands",
    "warn_expiration_percent",
)


class _Thresholds(_Model):
    """The monitoring thresholds (None: not checked)."""

    #: lag (age of the oldest undelivered transaction) at or above which ``status --check`` warns
    warn_latency_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    #: the same lag at or above which it is critical
    critical_latency_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    #: undelivered commands at or above which it warns
    warn_pending_commands: Annotated[int, Field(ge=0)] | None = None
    #: share of ``max_retention_hours`` passed towards expiry (percent) at or above which it warns
    warn_expiration_percent: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = None

    def thresholds(self) -> dict[str, float | int]:
        """The thresholds set here (only those)."""
        return {k: getattr(self, k) for k in THRESHOLD_KEYS if getattr(self, k) is not None}


# ---------------------------------------------------------------------- publications
class Publication(_Thresholds):
    name: PublicationName
    articles: Annotated[list[Article], Field(min_length=1)]
    #: Default of the articles' option of the same name.
    updates_as_delete_insert: DeleteInsertMode = "key_changes"
    #: Subscriptions may update immediately (two-phase commit at the publisher; SQL Server's
    #: ``@allow_sync_tran``).  Once allowed, it cannot be turned off (drop and recreate instead).
    allow_sync_tran: bool = False
    #: Subscriptions may queue their changes for the Queue Reader (``@allow_queued_tran``).
    allow_queued_tran: bool = False
    #: How the Queue Reader resolves conflicts (``@conflict_policy``); needs ``allow_queued_tran``.
    conflict_policy: InstanceOf[ConflictPolicy] = ConflictPolicy.PUB_WINS
    #: Retention (docs/retention.md): delivered commands are kept at least ``min_retention_hours``
    #: (SQL Server's @min_distretention); a subscription not synchronized within
    #: ``max_retention_hours`` while commands wait for it expires (@max_distretention); the Log
    #: Reader warns when the publication's slot retains more than ``max_slot_wal_mb`` MB of WAL.
    min_retention_hours: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    max_retention_hours: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 72.0
    max_slot_wal_mb: Annotated[int, Field(ge=1)] | None = None
    #: Distribution Agent: how its subscriptions' batches are applied (a subscription may override it).
    apply_mode: ApplyMode = "auto"

    @model_validator(mode="after")
    def _retention(self) -> Publication:
        if self.min_retention_hours > self.max_retention_hours:
            raise _error(
                f"publication {self.name!r} has min_retention_hours {self.min_retention_hours} above "
                f"max_retention_hours {self.max_retention_hours}: make the minimum at most the maximum",
                at=("min_retention_hours",),
            )
        return self

    def retention_options(self) -> dict[str, Any]:
        """The retention keys written in the file (only those)."""
        keys = ("min_retention_hours", "max_retention_hours", "max_slot_wal_mb")
        return {k: getattr(self, k) for k in keys if k in self.model_fields_set}

    @field_validator("conflict_policy", mode="before")
    @classmethod
    def _policy(cls, value: Any) -> ConflictPolicy:
        try:
            return parse_conflict_policy(value)
        except TopologyError as exc:
            raise _error(str(exc)) from None

    @model_validator(mode="after")
    def _updating(self) -> Publication:
        if "conflict_policy" in self.model_fields_set and not self.allow_queued_tran:
            raise _error(
                f"publication {self.name!r} sets conflict_policy but does not allow queued updating: "
                f"add 'allow_queued_tran: true' or remove conflict_policy",
                at=("conflict_policy",),
            )
        return self

    @property
    def updatable(self) -> bool:
        """Subscriptions may update (immediately or queued): published tables carry row versions."""
        return self.allow_sync_tran or self.allow_queued_tran

    def updating_options(self) -> dict[str, Any]:
        """``allow_sync_tran``, ``allow_queued_tran`` and, when queued updating is allowed,
        ``conflict_policy``, as written in the file (a policy without queued updating is an error)."""
        options: dict[str, Any] = {"allow_sync_tran": self.allow_sync_tran, "allow_queued_tran": self.allow_queued_tran}
        if self.allow_queued_tran:
            options["conflict_policy"] = str(self.conflict_policy)
        return options

    @model_validator(mode="after")
    def _articles(self) -> Publication:
        names: dict[str, int] = {}
        sources: dict[str, int] = {}
        dests: dict[str, int] = {}
        for index, art in enumerate(self.articles):
            if art.name in names:
                raise _error(
                    f"duplicate article {art.name!r} in publication {self.name!r} (also articles"
                    f"[{names[art.name]}]): give each article a distinct name",
                    at=("articles", index, "name"),
                )
            if art.source in sources:
                raise _error(
                    f"duplicate article: table {art.source} is published twice in publication "
                    f"{self.name!r} (also articles[{sources[art.source]}]): publish it once",
                    at=("articles", index, "table"),
                )
            if art.destination in dests:
                raise _error(
                    f"duplicate article destination {art.destination} in publication {self.name!r} "
                    f"(also articles[{dests[art.destination]}]): two articles would write the same "
                    f"subscriber table; give one another destination",
                    at=("articles", index, "destination"),
                )
            names[art.name] = sources[art.source] = dests[art.destination] = index
            if "updates_as_delete_insert" not in art.model_fields_set:
                art.updates_as_delete_insert = self.updates_as_delete_insert
        return self

    def article(self, name: str) -> Article:
        for art in self.articles:
            if art.name == name:
                return art
        raise TopologyError(f"publication {self.name!r} has no article {name!r}")


# ---------------------------------------------------------------------- subscriptions
class Subscription(_Thresholds):
    publication: str
    subscriber: str
    #: Distribution Agent: transactions per subscriber commit (SQL Server's CommitBatchSize).
    commit_batch_size: BatchSize = 100
    #: Distribution Agent: commands per subscriber commit (SQL Server's CommitBatchThreshold).
    commit_batch_threshold: BatchThreshold = 1000
    #: Distribution Agent: parallel connections to the subscriber (SQL Server's SubscriptionStreams).
    subscription_streams: Streams = 1
    #: Distribution Agent: errors that skip the failing transaction (SQL Server's SkipErrors):
    #: "row_not_found" (20598) and/or "duplicate_key" (2627).
    skip_errors: list[SkipError] = Field(default_factory=list)
    #: Distribution Agent: how batches are applied (None: the publication's ``apply_mode``).
    apply_mode: ApplyMode | None = None
    #: The older spelling of ``apply_mode: net_change`` (``true``); ``false`` changes nothing.
    bulk_apply: bool = False
    #: How the subscriber's own changes reach the publisher (SQL Server's ``@update_mode``):
    #: read only (default), sync tran, queued tran, failover or queued failover.
    update_mode: InstanceOf[UpdateMode] = UpdateMode.READ_ONLY
    #: ``true``: ``apply`` pauses the subscription (the Distribution Agent skips it), ``false``:
    #: ``apply`` resumes it; absent: ``apply`` leaves it as ``airflow-repl pause|resume`` set it.
    paused: bool | None = None

    @field_validator("update_mode", mode="before")
    @classmethod
    def _update_mode(cls, value: Any) -> UpdateMode:
        try:
            return parse_update_mode(value)
        except TopologyError as exc:
            raise _error(str(exc)) from None

    @model_validator(mode="after")
    def _apply_mode(self) -> Subscription:
        if self.bulk_apply and self.apply_mode not in (None, "net_change"):
            raise _error(
                f"subscription of subscriber {self.subscriber!r} to publication {self.publication!r} sets "
                f"apply_mode {self.apply_mode!r} and bulk_apply true (which means net_change): keep apply_mode "
                f"and remove bulk_apply",
                at=("bulk_apply",),
            )
        return self

    @property
    def name(self) -> str:
        return f"{self.publication}__{self.subscriber}"

    def own_apply_mode(self) -> ApplyMode | None:
        """The apply mode the subscription sets itself (``bulk_apply: true`` is ``net_change``), or
        None: its publication's."""
        if self.apply_mode is not None:
            return self.apply_mode
        return "net_change" if self.bulk_apply else None

    def options(self) -> dict[str, Any]:
        """The Distribution Agent's options (everything but the two names, the update mode and
        ``paused``, which the distribution database records in columns of their own;
        ``apply_mode`` only when the subscription sets it)."""
        exclude = {"publication", "subscriber", "update_mode", "paused", *THRESHOLD_KEYS}
        return self.model_dump(exclude=exclude if self.apply_mode is not None else exclude | {"apply_mode"})


# ---------------------------------------------------------------------- the whole file
class TopologyModel(_Model):
    """The topology file's top level (see :class:`Topology` for the object the engine uses)."""

    publisher: Endpoint
    distributor: Endpoint
    subscribers: dict[SubscriberName, Endpoint] = Field(default_factory=dict)
    publications: Annotated[list[Publication], Field(min_length=1)]
    subscriptions: list[Subscription] = Field(default_factory=list)
    #: Folder where the Snapshot Agent writes snapshot folders (``${VAR:-default}`` expanded).
    snapshot_folder: str = "snapshots"

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return value
        raise _error(
            f"a topology must be a mapping with publisher, distributor, subscribers, publications and "
            f"subscriptions, got {_describe(value)} (see docs/topology.md)"
        )

    @field_validator("snapshot_folder")
    @classmethod
    def _folder(cls, value: str) -> str:
        try:
            folder = expand_env(value, "snapshot_folder")
        except TopologyError as exc:
            raise _error(str(exc)) from None
        if not folder.strip() or "\x00" in folder:
            raise _error(f"snapshot_folder {value!r} expands to {folder!r}, which is not a usable path: give a folder")
        return folder

    @model_validator(mode="after")
    def _references(self) -> TopologyModel:
        for role in ("publisher", "distributor"):
            if is_mariadb(getattr(self, role).ref):
                raise _error(
                    f"a MariaDB server cannot be the {role}: it must be PostgreSQL (MariaDB servers can only be "
                    f"subscribers)",
                    at=(role,),
                )
        publications = self._publication_indexes()
        pairs: dict[tuple[str, str], int] = {}
        for index, sub in enumerate(self.subscriptions):
            self._check_subscription(index, sub, publications)
            pair = (sub.publication, sub.subscriber)
            if pair in pairs:
                raise _error(
                    f"subscriber {sub.subscriber!r} subscribes to publication {sub.publication!r} twice "
                    f"(also subscriptions[{pairs[pair]}]): remove one",
                    at=("subscriptions", index),
                )
            pairs[pair] = index
        return self

    def _publication_indexes(self) -> dict[str, int]:
        """Publication name -> its index in the list; a name defined twice is an error."""
        seen: dict[str, int] = {}
        for index, pub in enumerate(self.publications):
            if pub.name in seen:
                raise _error(
                    f"publication {pub.name!r} is defined twice (also publications[{seen[pub.name]}]): "
                    f"rename one or merge their articles",
                    at=("publications", index, "name"),
                )
            seen[pub.name] = index
        return seen

    def _check_subscription(self, index: int, sub: Subscription, publications: dict[str, int]) -> None:
        """The subscription names a defined publication and a defined subscriber."""
        if sub.publication not in publications:
            raise _error(
                f"subscription names unknown publication {sub.publication!r}; the topology defines: "
                f"{', '.join(publications)}",
                at=("subscriptions", index, "publication"),
            )
        if sub.subscriber not in self.subscribers:
            raise _error(
                f"subscription to {sub.publication!r} names unknown subscriber {sub.subscriber!r}; "
                f"define it under 'subscribers'",
                at=("subscriptions", index, "subscriber"),
            )
        _check_update_mode(index, sub, self.publications[publications[sub.publication]])


def _check_update_mode(index: int, sub: Subscription, pub: Publication) -> None:
    """An updating mode needs its publication to allow it: queued modes ``allow_queued_tran``,
    immediate modes ``allow_sync_tran``, failover modes both."""
    needed = [
        option
        for option, needs in (
            ("allow_sync_tran", sub.update_mode.needs_sync_tran),
            ("allow_queued_tran", sub.update_mode.needs_queued_tran),
        )
        if needs and not getattr(pub, option)
    ]
    if needed:
        raise _error(
            f"subscription of {sub.subscriber!r} uses update_mode {str(sub.update_mode)!r}, which publication "
            f"{pub.name!r} does not allow: set {' and '.join(f'{o}: true' for o in needed)} on the publication "
            f"or choose another update_mode",
            at=("subscriptions", index, "update_mode"),
        )


@dataclass
class Topology:
    """The validated topology the engine works with (publications by name)."""

    publisher: Endpoint
    distributor: Endpoint
    subscribers: dict[str, Endpoint]
    publications: dict[str, Publication]
    subscriptions: list[Subscription]
    #: Folder where the Snapshot Agent writes snapshot folders.
    snapshot_folder: str = "snapshots"
    #: Where each server was written (``topology file t.yaml:1:12``), for resolution errors;
    #: filled by :func:`load`.
    origins: dict[Loc, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_model(cls, model: TopologyModel) -> Topology:
        return cls(
            publisher=model.publisher,
            distributor=model.distributor,
            subscribers=dict(model.subscribers),
            publications={p.name: p for p in model.publications},
            subscriptions=list(model.subscriptions),
            snapshot_folder=model.snapshot_folder,
        )

    # ------------------------------------------------------------------ lookups
    def publication(self, name: str) -> Publication:
        try:
            return self.publications[name]
        except KeyError:
            raise TopologyError(
                f"unknown publication {name!r}; the topology defines: {', '.join(sorted(self.publications)) or 'none'}"
            ) from None

    def subscriptions_of(self, publication: str) -> list[Subscription]:
        return [s for s in self.subscriptions if s.publication == publication]

    def subscription(self, publication: str, subscriber: str) -> Subscription:
        for sub in self.subscriptions:
            if sub.publication == publication and sub.subscriber == subscriber:
                return sub
        raise TopologyError(f"no subscription of subscriber {subscriber!r} to publication {publication!r}")

    def apply_mode(self, publication: str, subscriber: str) -> ApplyMode:
        """The subscription's apply mode: its own (``apply_mode`` or ``bulk_apply``) over its
        publication's."""
        own = self.subscription(publication, subscriber).own_apply_mode()
        return own if own is not None else self.publication(publication).apply_mode

    def thresholds(self, publication: str, subscriber: str) -> dict[str, float | int]:
        """The monitoring thresholds of a subscription: its own keys over its publication's
        (only the publication's when the file has no such subscription)."""
        pub = self.publications.get(publication)
        found = dict(pub.thresholds()) if pub is not None else {}
        for sub in self.subscriptions:
            if sub.publication == publication and sub.subscriber == subscriber:
                found.update(sub.thresholds())
        return found

    def subscriber_conninfo(self, name: str) -> str:
        return self.subscribers[name].require(f"subscriber {name}")

    # ------------------------------------------------------------------ resolution
    def servers(self) -> dict[Loc, Endpoint]:
        """Every server of the topology by its place in the file: ``("publisher",)``,
        ``("distributor",)``, ``("subscribers", name)`` (:func:`format_loc` names it)."""
        return {
            ("publisher",): self.publisher,
            ("distributor",): self.distributor,
            **{("subscribers", k): v for k, v in self.subscribers.items()},
        }

    def resolve(self, resolver: Resolver) -> Topology:
        """Resolve every connection reference to a connection string (in place); an error names
        the server's role (``subscribers.reporting: connection id ... is not defined ...``)."""
        for loc, endpoint in self.servers().items():
            if endpoint.conninfo is None:
                try:
                    endpoint.conninfo = resolver(endpoint.ref)
                except TopologyError as exc:
                    where = f"{self.origins[loc]}: " if loc in self.origins else ""
                    raise TopologyError(f"{where}{format_loc(loc)}: {exc}") from exc.__cause__
        self._check_engines()
        return self

    def is_mariadb_subscriber(self, name: str) -> bool:
        """Whether subscriber ``name`` is a MariaDB (MySQL) server (known once resolved, or from its URI)."""
        endpoint = self.subscribers[name]
        return is_mariadb(endpoint.conninfo or endpoint.ref)

    def _check_engines(self) -> None:
        """Publisher and distributor are PostgreSQL; a MariaDB subscriber's subscriptions are
        read only (updatable subscriptions stay PostgreSQL-only, as SQL Server keeps them for
        SQL Server subscribers)."""
        for role, endpoint in (("publisher", self.publisher), ("distributor", self.distributor)):
            if is_mariadb(endpoint.conninfo or endpoint.ref):
                raise TopologyError(
                    f"{role}: {endpoint.display} is a MariaDB server; the {role} must be PostgreSQL "
                    f"(MariaDB servers can only be subscribers)"
                )
        for sub in self.subscriptions:
            if sub.update_mode.updatable and self.is_mariadb_subscriber(sub.subscriber):
                raise TopologyError(
                    f"subscription of MariaDB subscriber {sub.subscriber!r} to publication {sub.publication!r} has "
                    f"update_mode {str(sub.update_mode)!r}: updatable subscriptions (immediate, queued) are "
                    f"PostgreSQL-only; remove update_mode (read only)"
                )

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self, *, with_secrets: bool = False) -> dict[str, Any]:
        def ep(e: Endpoint) -> Any:
            if with_secrets:
                return {"ref": e.ref, "conninfo": e.conninfo}
            return e.display

        return {
            "publisher": ep(self.publisher),
            "distributor": ep(self.distributor),
            "subscribers": {k: ep(v) for k, v in self.subscribers.items()},
            "snapshot_folder": self.snapshot_folder,
            "publications": [
                {
                    "name": p.name,
                    **p.updating_options(),
                    **p.retention_options(),
                    **({"apply_mode": p.apply_mode} if "apply_mode" in p.model_fields_set else {}),
                    "articles": [a.to_dict() for a in p.articles],
                }
                for p in self.publications.values()
            ],
            "subscriptions": [
                {
                    "publication": s.publication,
                    "subscriber": s.subscriber,
                    **s.options(),
                    "update_mode": str(s.update_mode),
                    **({"paused": s.paused} if s.paused is not None else {}),
                }
                for s in self.subscriptions
            ],
        }


# ---------------------------------------------------------------------- error messages
def _unwrap(tp: Any) -> Any:
    """``Annotated[X, ...]`` and ``X | None`` -> ``X``."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        else:
            return tp


def _keys(model: type[_Model]) -> dict[str, str]:
    """Key as written in the file -> field name."""
    out: dict[str, str] = {}
    for name, info in model.model_fields.items():
        alias = info.validation_alias
        for key in alias.choices if isinstance(alias, AliasChoices) else [name]:
            out[str(key)] = name
    return out


def _model_at(loc: Loc) -> type[_Model] | None:
    """The model class that validates the mapping at ``loc``, if any."""
    tp: Any = TopologyModel
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, _Model):
            name = _keys(tp).get(str(part))
            if name is None:
                return None
            tp = tp.model_fields[name].annotation
        elif get_origin(tp) is list and isinstance(part, int):
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, _Model) else None


_BOOL_HINT = "YAML reads unquoted yes/no/on/off/true/false as booleans; quote the value if you mean a string"


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if value is None:
        return "nothing (null)"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):  # never echo anything that may be a URI with a password
        return f"the string {value!r}" if len(value) <= 40 and not re.search(r"[:/@]", value) else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
}


def _type_fix(kind: str, value: Any) -> str:
    if value is None:
        return "give a value or remove the key"
    if isinstance(value, bool) and kind == "int_type":
        return "write a number; YAML reads unquoted true/false/yes/no/on/off as booleans, never as 1 or 0"
    if isinstance(value, bool) and kind != "bool_type":
        return _BOOL_HINT
    if kind == "string_type" and isinstance(value, (list, dict)):
        return "write a single value (quote it if it has special characters)"
    if kind == "string_type":
        return "quote the value to make it a string"
    if kind == "int_type" and isinstance(value, str):
        return "write the number without quotes"
    if kind == "int_type" and isinstance(value, float):
        return "write a whole number"
    if kind == "bool_type":
        return "write true or false, without quotes"
    if kind == "list_type" and isinstance(value, dict):
        return "write each entry as a list item starting with '- '"
    if kind == "list_type":
        return "write a list ([a, b] or '- ' items)"
    if kind in ("dict_type", "model_type"):
        return "write 'key: value' entries under it"
    return "see docs/topology.md"


def _known_keys(loc: Loc) -> str:
    """``did you mean 'x'? known keys here: ...`` for the mapping holding the key at ``loc``."""
    model = _model_at(loc[:-1])
    known = sorted(k for k in _keys(model) if k not in model._hidden_keys) if model else []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}known keys here: {', '.join(known)}"


def _message(err: ErrorDetails, loc: Loc) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == "topology":
        return str(ctx["message"])
    if kind == "missing" and _model_at(loc[:-1]) is Endpoint:
        return "a server mapping needs conn_id (an Airflow connection id) or uri (a postgresql:// URI): add one"
    if kind == "missing":
        return f"required key {loc[-1]!r} is missing: add it"
    if kind == "extra_forbidden":
        return f"unknown key {loc[-1]!r}; {_known_keys(loc)}"
    if kind == "invalid_key":
        return f"the key {loc[-1]!r} is not a name; {_known_keys(loc)}"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_describe(value)}; {_type_fix(kind, value)}"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        low, high = RANGES.get(str(loc[-1]), (None, None))
        bound = f"an integer from {low} to {high}" if low is not None else err["msg"].lower()
        return f"{value} is out of range: use {bound}"
    if kind == "too_short":
        return "the list is empty: give at least one entry"
    if kind == "literal_error" and "skip_errors" in loc:
        return (
            f"{_describe(value)} is not an error that can be skipped: skip_errors of a subscription must list "
            f"some of: row_not_found (20598), duplicate_key (2627)"
        )
    if kind == "literal_error":
        return f"{_describe(value)} is not allowed; choose one of {ctx.get('expected', '?')}"
    if kind == "recursion_loop":
        return "refers to itself (a recursive YAML alias): write the value out"
    return f"{err['msg']}; see docs/topology.md"


def _report(exc: ValidationError, source: Source | None) -> TopologyError:
    """The first problem (by position in the file) as one line."""
    problems: list[tuple[tuple[int, int], str]] = []
    for order, err in enumerate(exc.errors(include_url=False)):
        loc: Loc = tuple(err["loc"]) + tuple((err.get("ctx") or {}).get("at", ()))
        key = err["type"] == "extra_forbidden"
        if loc and loc[-1] == "[key]":  # a mapping key (a subscriber name) itself is wrong
            loc, key = loc[:-1], True
        text = _message(err, loc)
        if err["type"] == "missing":  # name the mapping the key belongs in
            loc = loc[:-1]
        if source is None:
            problems.append(((0, order), f"topology: {format_loc(loc)}: {text}"))
        else:
            pos = source.position(loc, key=key)
            problems.append(
                ((pos.line, pos.column) if pos else (0, 0), f"{source.where(loc, key=key)}: {format_loc(loc)}: {text}")
            )
    problems.sort(key=lambda p: p[0])
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return TopologyError(problems[0][1] + more)


def _validate(data: Any, source: Source | None) -> Topology:
    try:
        return Topology.from_model(TopologyModel.model_validate(data))
    except ValidationError as exc:
        raise _report(exc, source) from None


# ---------------------------------------------------------------------- loading
def from_dict(data: dict[str, Any]) -> Topology:
    """Build and statically check a topology from its dictionary (YAML) form."""
    return _validate(data, None)


_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: str, what: str) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}``; an unset variable without default is an error."""

    def sub(m: re.Match[str]) -> str:
        name: str = m.group(1)
        default: str | None = m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise TopologyError(
            f"{what} uses ${{{name}}}, which is not set: set it or give a default with ${{{name}:-value}}"
        )

    return _VAR_RE.sub(sub, value)


def load(path: str | Path) -> Topology:
    """Load a topology YAML file.  ``snapshot_folder`` may use ``${VAR:-default}``; a relative
    one is relative to the file."""
    path = Path(path)
    source = yaml_source.read(path)
    topo = _validate(source.data, source)
    topo.origins = {
        loc: source.where(loc)
        for loc in [("publisher",), ("distributor",), *(("subscribers", k) for k in topo.subscribers)]
    }
    folder = Path(topo.snapshot_folder).expanduser()
    topo.snapshot_folder = str(folder if folder.is_absolute() else (path.parent / folder).resolve())
    return topo
