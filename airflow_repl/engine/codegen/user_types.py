"""User-defined types and collations that published columns need at a subscriber.

The Snapshot Agent reads, from the publisher's catalog, every enum, domain (with its base type,
default, NOT NULL and CHECK constraints), composite type (with its attributes' types), simple
range type and non-default collation the replicated columns use, recursively, in dependency
order (what an object uses comes before it).  ``schema.sql`` creates the missing ones ahead of
the tables (:func:`script`); before anything changes at a subscriber, :func:`check` refuses
objects that exist there with another definition, or that are missing and cannot be scripted
(base types of extensions, ranges with a canonical function), naming each one and the fix.

Definitions are read with ``search_path = pg_catalog`` so that every type, collation and
function they mention is schema-qualified, and are compared as plain values (no OIDs), so the
same reader describes an object at the publisher and at a subscriber.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.postgres import raw_sql
from airflow_repl.engine.postgres.catalog import catalog_search_path
from airflow_repl.engine.postgres.quoting import comment, dollar_quote, ident, literal, qualified

_BUILTIN_SCHEMAS = ("pg_catalog", "information_schema")


@dataclass
class UserObject:
    kind: str  # "collation", "enum", "domain", "composite", "range" or "type" (cannot be scripted)
    schema: str
    name: str
    definition: dict[str, Any]  # what must be equal at a subscriber
    create: str | None  # the statement creating it; None when it cannot be scripted
    hint: str = ""  # how to create it when it cannot be scripted
    scripted: bool = True  # False for objects that come with the server (pg_catalog collations)

    @property
    def label(self) -> str:
        return f"{self.kind} {self.schema}.{self.name}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UserObject:
        return cls(**data)


_Described = tuple[UserObject | None, list[int], list[int]]  # object, types and collations it uses


@dataclass
class Requirements:
    """What the replicated columns need: the objects in dependency order, and each column's
    collation where it is not its type's default (article name -> column -> quoted name)."""

    objects: list[UserObject] = field(default_factory=list)
    column_collations: dict[str, dict[str, str]] = field(default_factory=dict)


# ---------------------------------------------------------------------- reading a catalog
class _Reader:
    """Collects objects depth first: what an object uses is appended before the object."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.seen: set[tuple[str, int]] = set()
        self.objects: list[UserObject] = []

    # -- collations
    def collation(self, oid: int) -> None:
        if not oid or ("c", oid) in self.seen:
            return
        self.seen.add(("c", oid))
        obj = describe_collation(self.conn, oid)
        if obj is not None:
            self.objects.append(obj)

    # -- types
    def type(self, oid: int) -> None:
        if ("t", oid) in self.seen:
            return
        self.seen.add(("t", oid))
        obj, types, collations = describe_type(self.conn, oid)
        for t in types:
            self.type(t)
        for c in collations:
            self.collation(c)
        if obj is not None:
            self.objects.append(obj)


def _collation_name(conn: psycopg.Connection, oid: int) -> str | None:
    row = conn.execute(
        "SELECT n.nspname, c.collname FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.collnamespace WHERE c.oid = %s",
        (oid,),
    ).fetchone()
    return None if row is None or row[1] == "default" else qualified(*row)


def describe_collation(conn: psycopg.Connection, oid: int) -> UserObject | None:
    """A collation (None for the database default)."""
    schema, name, data = raw_sql.one_row(
        conn.execute(
            "SELECT n.nspname, c.collname, to_jsonb(c) FROM pg_catalog.pg_collation c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.collnamespace WHERE c.oid = %s",
            (oid,),
        )
    )
    if name == "default":
        return None
    provider = {"c": "libc", "i": "icu", "d": "default"}.get(data["collprovider"], data["collprovider"])
    # PostgreSQL 15 calls the ICU locale colliculocale, 17 colllocale
    icu = data.get("colliculocale") or data.get("colllocale")
    definition = {"provider": provider, "deterministic": data["collisdeterministic"]}
    if provider == "icu":
        definition["locale"] = icu
        options = f"provider = icu, locale = {literal(icu or '')}"
    else:
        definition.update(lc_collate=data["collcollate"], lc_ctype=data["collctype"])
        options = (
            f"provider = libc, lc_collate = {literal(data['collcollate'] or '')}, "
            f"lc_ctype = {literal(data['collctype'] or '')}"
        )
    if not data["collisdeterministic"]:
        options += ", deterministic = false"
    builtin = schema in _BUILTIN_SCHEMAS
    return UserObject(
        "collation",
        schema,
        name,
        definition,
        f"CREATE COLLATION IF NOT EXISTS {qualified(schema, name)} ({options});",
        hint=f"create it at the subscriber with the same provider and locale ({options})",
        scripted=not builtin,
    )


def describe_type(conn: psycopg.Connection, oid: int) -> _Described:
    """A type as a :class:`UserObject` (None for built-in types and arrays), with the types and
    collations it uses.  Run with ``search_path = pg_catalog`` (see :func:`~airflow_repl.engine.postgres.catalog.catalog_search_path`)."""
    (schema, name, typtype, category, elem, base, relid, collation, notnull, typmod, array_handler, extension) = (
        raw_sql.one_row(
            conn.execute(
                "SELECT n.nspname, t.typname, t.typtype, t.typcategory, t.typelem, t.typbasetype, t.typrelid, "
                "t.typcollation, t.typnotnull, t.typtypmod, "
                "t.typsubscript = 'pg_catalog.array_subscript_handler'::regproc, "
                "(SELECT e.extname FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid "
                " WHERE d.classid = 'pg_catalog.pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e' "
                " AND d.refclassid = 'pg_catalog.pg_extension'::regclass) "
                "FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace "
                "WHERE t.oid = %s",
                (oid,),
            )
        )
    )
    if elem and array_handler and category == "A":
        return None, [elem], []  # an array: what matters is its element type
    if schema in _BUILTIN_SCHEMAS:
        return None, [], []
    if extension is not None:
        hint = f"CREATE EXTENSION {ident(extension)} WITH SCHEMA {ident(schema)}"
        return UserObject("type", schema, name, {"extension": extension}, None, hint=hint), [], []
    if typtype == "e":
        return _enum(conn, oid, schema, name), [], []
    if typtype == "d":
        return _domain(conn, oid, schema, name, base, typmod, collation, notnull)
    if typtype == "c":
        return _composite(conn, schema, name, relid)
    if typtype == "r":
        return _range(conn, oid, schema, name)
    if typtype == "m":  # a multirange: its range type creates it
        return None, [_range_of_multirange(conn, oid)], []
    hint = "create it at the subscriber as at the publisher"
    return UserObject("type", schema, name, {"typtype": typtype}, None, hint=hint), [], []


def _enum(conn: psycopg.Connection, oid: int, schema: str, name: str) -> UserObject:
    labels = [
        str(r[0])
        for r in conn.execute(
            "SELECT enumlabel FROM pg_catalog.pg_enum WHERE enumtypid = %s ORDER BY enumsortorder", (oid,)
        )
    ]
    create = f"CREATE TYPE {qualified(schema, name)} AS ENUM ({', '.join(literal(x) for x in labels)});"
    return UserObject("enum", schema, name, {"labels": labels}, create)


def _range_of_multirange(conn: psycopg.Connection, oid: int) -> int:
    (range_oid,) = raw_sql.one_row(
        conn.execute("SELECT rngtypid FROM pg_catalog.pg_range WHERE rngmultitypid = %s", (oid,))
    )
    return int(range_oid)


def _default_collation_of(conn: psycopg.Connection, type_oid: int) -> int:
    (collation,) = raw_sql.one_row(
        conn.execute("SELECT typcollation FROM pg_catalog.pg_type WHERE oid = %s", (type_oid,))
    )
    return int(collation)


def _domain(
    conn: psycopg.Connection, oid: int, schema: str, name: str, base: int, typmod: int, collation: int, notnull: bool
) -> _Described:
    base_text, default = raw_sql.one_row(
        conn.execute(
            "SELECT pg_catalog.format_type(%s, %s), pg_catalog.pg_get_expr(typdefaultbin, 0) "
            "FROM pg_catalog.pg_type WHERE oid = %s",
            (base, typmod, oid),
        )
    )
    checks = [
        list(r)
        for r in conn.execute(
            "SELECT conname, pg_catalog.pg_get_constraintdef(oid) FROM pg_catalog.pg_constraint "
            "WHERE contypid = %s AND contype = 'c' ORDER BY conname",
            (oid,),
        )
    ]
    own_collation = collation if collation and collation != _default_collation_of(conn, base) else 0
    coll_name = _collation_name(conn, own_collation) if own_collation else None
    definition = {
        "base": base_text,
        "collation": coll_name,
        "default": default,
        "not_null": notnull,
        "constraints": checks,
    }
    text = f"CREATE DOMAIN {qualified(schema, name)} AS {base_text}"
    if coll_name:
        text += f" COLLATE {coll_name}"
    if default is not None:
        text += f" DEFAULT {default}"
    if notnull:
        text += " NOT NULL"
    text += "".join(f" CONSTRAINT {ident(n)} {d}" for n, d in checks)
    return UserObject("domain", schema, name, definition, text + ";"), [base], [own_collation] if own_collation else []


def _composite(conn: psycopg.Connection, schema: str, name: str, relid: int) -> _Described:
    (relkind,) = raw_sql.one_row(conn.execute("SELECT relkind FROM pg_catalog.pg_class WHERE oid = %s", (relid,)))
    if relkind != "c":
        hint = f"it is the row type of a table: create table {schema}.{name} at the subscriber"
        return UserObject("type", schema, name, {"row_type_of": relkind}, None, hint=hint), [], []
    fields: list[list[str | None]] = []
    types: list[int] = []
    collations: list[int] = []
    parts: list[str] = []
    for attname, typid, typ, attcoll, typcoll in _attributes(conn, relid):
        coll = _collation_name(conn, attcoll) if attcoll and attcoll != typcoll else None
        fields.append([attname, typ, coll])
        types.append(typid)
        if coll:
            collations.append(attcoll)
        parts.append(f"{ident(attname)} {typ}" + (f" COLLATE {coll}" if coll else ""))
    create = f"CREATE TYPE {qualified(schema, name)} AS ({', '.join(parts)});"
    return UserObject("composite", schema, name, {"attributes": fields}, create), types, collations


def _attributes(conn: psycopg.Connection, relid: int) -> list[tuple[Any, ...]]:
    """(name, type oid, format_type text, collation, the type's default collation) of each
    attribute of a composite type, in order."""
    return conn.execute(
        "SELECT a.attname, a.atttypid, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attcollation, "
        "t.typcollation FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (relid,),
    ).fetchall()


def _range(conn: psycopg.Connection, oid: int, schema: str, name: str) -> _Described:
    subtype, subtype_text, coll, opclass_default, opclass, canonical, subdiff, subdiff_builtin, multirange = (
        raw_sql.one_row(
            conn.execute(
                "SELECT r.rngsubtype, pg_catalog.format_type(r.rngsubtype, NULL), r.rngcollation, o.opcdefault, "
                "pg_catalog.quote_ident(on_.nspname) || '.' || pg_catalog.quote_ident(o.opcname), "
                "r.rngcanonical::oid <> 0, "
                "CASE WHEN r.rngsubdiff::oid <> 0 THEN r.rngsubdiff::regprocedure::text END, "
                "(SELECT pn.nspname = 'pg_catalog' FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace pn "
                " ON pn.oid = p.pronamespace WHERE p.oid = r.rngsubdiff), "
                "(SELECT quote_ident(mn.nspname) || '.' || quote_ident(m.typname) FROM pg_catalog.pg_type m "
                " JOIN pg_catalog.pg_namespace mn ON mn.oid = m.typnamespace WHERE m.oid = r.rngmultitypid) "
                "FROM pg_catalog.pg_range r JOIN pg_catalog.pg_opclass o ON o.oid = r.rngsubopc "
                "JOIN pg_catalog.pg_namespace on_ ON on_.oid = o.opcnamespace WHERE r.rngtypid = %s",
                (oid,),
            )
        )
    )
    own_coll = coll if coll and coll != _default_collation_of(conn, subtype) else 0
    coll_name = _collation_name(conn, own_coll) if own_coll else None
    definition = {
        "subtype": subtype_text,
        "collation": coll_name,
        "opclass": None if opclass_default else opclass,
        "subtype_diff": subdiff,
        "canonical": canonical,
        "multirange": multirange,
    }
    if canonical or (subdiff is not None and not subdiff_builtin):
        hint = (
            "its canonical or subtype_diff function is user-defined: create the function and "
            "the range type at the subscriber as at the publisher"
        )
        return UserObject("range", schema, name, definition, None, hint=hint), [subtype], []
    create = f"CREATE TYPE {qualified(schema, name)} AS RANGE ({', '.join(_range_options(definition))});"
    return UserObject("range", schema, name, definition, create), [subtype], [own_coll] if own_coll else []


def _range_options(definition: dict[str, Any]) -> list[str]:
    """CREATE TYPE ... AS RANGE options of a range whose functions are built in."""
    opts = [f"SUBTYPE = {definition['subtype']}"]
    if definition["opclass"] is not None:  # not the subtype's default operator class
        opts.append(f"SUBTYPE_OPCLASS = {definition['opclass']}")
    if definition["collation"]:
        opts.append(f"COLLATION = {definition['collation']}")
    if definition["subtype_diff"] is not None:
        opts.append(f"SUBTYPE_DIFF = {definition['subtype_diff'].split('(')[0]}")
    opts.append(f"MULTIRANGE_TYPE_NAME = {definition['multirange']}")
    return opts


def read(conn: psycopg.Connection, articles: list[ResolvedArticle]) -> Requirements:
    """What the articles' replicated columns need, read from the publisher's catalog (run inside
    a transaction, e.g. the snapshot's)."""
    reader = _Reader(conn)
    req = Requirements()
    with catalog_search_path(conn):
        for art in articles:
            wanted = set(art.column_names)
            for attname, typid, attcoll, typcoll in conn.execute(
                "SELECT a.attname, a.atttypid, a.attcollation, t.typcollation FROM pg_catalog.pg_attribute a "
                "JOIN pg_catalog.pg_type t ON t.oid = a.atttypid WHERE a.attrelid = %s AND a.attnum > 0 "
                "AND NOT a.attisdropped ORDER BY a.attnum",
                (art.table.oid,),
            ):
                if attname not in wanted:
                    continue
                reader.type(typid)
                if attcoll and attcoll != typcoll:
                    reader.collation(attcoll)
                    name = _collation_name(conn, attcoll)
                    if name:
                        req.column_collations.setdefault(art.name, {})[attname] = name
    req.objects = reader.objects
    return req


# ---------------------------------------------------------------------- at a subscriber
def _find(conn: psycopg.Connection, obj: UserObject) -> UserObject | None:
    """The object of the same name at this server, described like the publisher's."""
    if obj.kind == "collation":
        row = conn.execute(
            "SELECT c.oid FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace n ON n.oid = c.collnamespace "
            "WHERE n.nspname = %s AND c.collname = %s AND c.collencoding IN (-1, pg_catalog.pg_char_to_encoding("
            "pg_catalog.getdatabaseencoding()))",
            (obj.schema, obj.name),
        ).fetchone()
        return describe_collation(conn, row[0]) if row else None
    row = conn.execute(
        "SELECT t.oid FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n "
        "ON n.oid = t.typnamespace WHERE n.nspname = %s AND t.typname = %s",
        (obj.schema, obj.name),
    ).fetchone()
    return describe_type(conn, row[0])[0] if row else None


def _differences(want: UserObject, have: UserObject) -> str:
    if have.kind != want.kind:
        return f"it is a {have.kind} here, a {want.kind} at the publisher"
    return "; ".join(
        f"{key} {have.definition.get(key)!r} here, {value!r} at the publisher"
        for key, value in want.definition.items()
        if have.definition.get(key) != value
    )


def check(conn: psycopg.Connection, objects: list[UserObject], subscriber: str) -> list[UserObject]:
    """Compare the objects with those at a subscriber; return the ones to create.  Raises
    ReplError listing every object that exists with another definition, or that is missing and
    cannot be scripted, with the fix.  Changes nothing."""
    problems: list[str] = []
    missing: list[UserObject] = []
    with conn.transaction(), catalog_search_path(conn):
        for obj in objects:
            have = _find(conn, obj)
            if have is None:
                if obj.create is None or not obj.scripted:
                    problems.append(f"{obj.label} is missing ({obj.hint})")
                else:
                    missing.append(obj)
            elif diff := _differences(obj, have):
                problems.append(f"{obj.label} differs ({diff})")
    if problems:
        raise ReplError(
            f"subscriber {subscriber!r} cannot take the types the published columns use: {'; '.join(problems)}. "
            f"Make them identical to the publisher's there (or drop them, and the Snapshot Agent creates them), "
            f"then run the Snapshot Agent again"
        )
    return missing


def script(objects: list[UserObject]) -> str:
    """``schema.sql``'s first part: each scriptable object created where it does not exist yet
    (the snapshot refuses, before running it, a subscriber where one exists with another
    definition)."""
    parts: list[str] = []
    for schema in dict.fromkeys(o.schema for o in objects if o.create and o.scripted):
        parts.append(f"CREATE SCHEMA IF NOT EXISTS {ident(schema)};")
    for obj in objects:
        if not obj.create or not obj.scripted:
            continue
        if obj.kind == "collation":
            parts.append(obj.create)
            continue
        body = (
            f"BEGIN\n    IF pg_catalog.to_regtype({literal(qualified(obj.schema, obj.name))}) IS NULL THEN\n"
            f"        {obj.create}\n    END IF;\nEND;\n"
        )
        parts.append(f"-- {obj.kind} {comment(f'{obj.schema}.{obj.name}')}\nDO {dollar_quote(body)};")
    return "\n".join(parts) + ("\n" if parts else "")
