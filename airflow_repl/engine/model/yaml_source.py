"""Reading a YAML file strictly, keeping where every value came from.

:func:`read` returns the data (plain dicts, lists and scalars, as ``yaml.safe_load`` gives) and,
for every value and mapping key, its line and column in the file, so that a validation error's
path (``publications[0].articles[1].row_filter``) can name ``file:line:col``.  Duplicate keys in a
mapping are an error naming both lines (PyYAML would silently keep the last one).  Every problem
is raised as one line, a :class:`~airflow_repl.engine.errors.TopologyError`; nothing in a message
quotes the file's text beyond a key, so a password in a URI never shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from airflow_repl.engine.errors import TopologyError

#: A path into the data: mapping keys and list indexes (pydantic's ``loc`` has the same form).
Loc = tuple[str | int, ...]

#: Nodes visited at most (aliases can multiply a small file into a huge tree).
MAX_NODES = 100_000
#: Nesting depth at most.
MAX_DEPTH = 64

_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Position:
    """1-based line and column."""

    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


def _position(node: Node) -> Position:
    return Position(node.start_mark.line + 1, node.start_mark.column + 1)


def format_loc(loc: Loc) -> str:
    """``publications[0].articles[1].row_filter``; odd mapping keys as ``subscribers['a b']``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "(top level)"


@dataclass
class Source:
    """A YAML document's data and the position of each of its values and keys."""

    name: str
    data: Any
    values: dict[Loc, Position] = field(default_factory=dict)
    keys: dict[Loc, Position] = field(default_factory=dict)

    def position(self, loc: Loc, *, key: bool = False) -> Position | None:
        """Where ``loc`` is in the file: the node itself, or the nearest enclosing one that exists
        (a missing key points at its mapping).  ``key`` prefers the key's position."""
        loc = tuple(loc)
        if key and loc in self.keys:
            return self.keys[loc]
        while loc:
            if loc in self.values:
                return self.values[loc]
            loc = loc[:-1]
        return self.values.get(())

    def where(self, loc: Loc, *, key: bool = False) -> str:
        """``topology file t.yaml:12:7`` (or without position when there is none)."""
        pos = self.position(loc, key=key)
        return f"topology file {self.name}:{pos}" if pos else f"topology file {self.name}"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader; the node tree is walked by :class:`_Walker` before construction."""


class _Walker:
    """Records positions and rejects duplicate keys, walking the composed node tree."""

    def __init__(self, loader: _Loader, source: Source) -> None:
        self.loader = loader
        self.source = source
        self.count = 0
        self.stack: list[int] = []

    def fail(self, node: Node, message: str) -> TopologyError:
        return TopologyError(f"topology file {self.source.name}:{_position(node)}: {message}")

    def walk(self, node: Node, loc: Loc) -> None:
        self.count += 1
        if self.count > MAX_NODES:
            raise self.fail(
                node,
                f"the document has more than {MAX_NODES} values (through aliases?); write the topology out plainly",
            )
        if len(loc) > MAX_DEPTH:
            raise self.fail(node, f"values nest more than {MAX_DEPTH} levels deep; a topology needs only a few")
        self.source.values.setdefault(loc, _position(node))
        if id(node) in self.stack:  # a recursive alias: the constructor builds it, validation rejects it
            return
        self.stack.append(id(node))
        if isinstance(node, MappingNode):
            self.mapping(node, loc)
        elif isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                self.walk(item, (*loc, index))
        self.stack.pop()

    def key(self, node: Node, loc: Loc) -> Any:
        if not isinstance(node, ScalarNode):
            raise self.fail(node, f"a key in {format_loc(loc)} is a list or mapping; keys must be plain names")
        return self.loader.construct_object(node)

    def mapping(self, node: MappingNode, loc: Loc) -> None:
        seen: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.key(key_node, loc)
            if key in seen:
                first = _position(seen[key])
                raise self.fail(
                    key_node,
                    f"{format_loc(loc)}: duplicate key {key!r} (also at line {first.line}, "
                    f"column {first.column}); YAML would keep only the last one: "
                    f"remove or rename one of them",
                )
            seen[key] = key_node
        self.loader.flatten_mapping(node)  # '<<' merge keys: merged entries first, own entries win
        entries: dict[Any, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            entries[self.key(key_node, loc)] = (key_node, value_node)
        for key, (key_node, value_node) in entries.items():
            if isinstance(key, (str, int)) and not isinstance(key, bool):
                path = (*loc, key)
                self.source.keys[path] = _position(key_node)
                self.source.values[path] = _position(value_node)
                self.walk(value_node, path)


def _yaml_error(name: str, exc: yaml.YAMLError, text: str) -> TopologyError:
    """One line from a PyYAML error: its position first, without the snippet of the file's text
    (a URI on that line may carry a password)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        problem = exc.problem or "invalid YAML"
        context = ""
        if exc.context and exc.context_mark:
            context = f" ({exc.context} at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1})"
        elif exc.context:
            context = f" ({exc.context})"
        return TopologyError(f"topology file {where}: invalid YAML: {problem}{context}; fix the YAML syntax there")
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        return TopologyError(
            f"topology file {name}:{line}:{column}: invalid YAML: character #x{exc.character:04x} "
            f"is not allowed in YAML; remove it"
        )
    return TopologyError(f"topology file {name}: invalid YAML: {type(exc).__name__}; fix the YAML syntax")


def parse(text: str, name: str) -> Source:
    """Parse one YAML document (a string); see the module docstring."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # checks the characters first
        node = loader.get_single_node()
        if node is None:
            raise TopologyError(
                f"topology file {name} is empty: write the topology's publisher, distributor, "
                f"subscribers, publications and subscriptions in it"
            )
        source = Source(name, None)
        _Walker(loader, source).walk(node, ())
        source.data = loader.construct_document(node)
        return source
    except yaml.YAMLError as exc:
        raise _yaml_error(name, exc, text) from None
    except RecursionError:
        raise TopologyError(
            f"topology file {name}: values nest too deeply; a topology needs only a few levels"
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def read(path: str | Path) -> Source:
    """Read and parse a UTF-8 YAML file; every file problem is one :class:`TopologyError` line."""
    path = Path(path)
    name = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TopologyError(f"topology file {name} does not exist: check the path") from None
    except IsADirectoryError:
        raise TopologyError(f"topology file {name} is a directory: give the path of the YAML file in it") from None
    except OSError as exc:
        raise TopologyError(
            f"topology file {name} cannot be read: {exc.strerror or type(exc).__name__}; "
            f"check the path and its permissions"
        ) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise TopologyError(
            f"topology file {name}:{line}: is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
            f"offset {exc.start}); save the file as UTF-8"
        ) from None
    if not text.strip():
        raise TopologyError(
            f"topology file {name} is empty: write the topology's publisher, distributor, "
            f"subscribers, publications and subscriptions in it"
        )
    return parse(text, name)
