"""Bad topology files through the command line (``airflow-repl apply -t FILE``), against real
servers: each case must exit 2 with exactly one ``airflow-repl: error:`` line that names the file
position and the YAML path (or the file problem), show no traceback, and change nothing at the
publisher, the distribution database or the subscriber."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import Env

from airflow_repl import cli
from airflow_repl.engine.postgres.connections import to_uri

# The base topology; its line numbers matter (the cases name them).
BASE = """\
publisher: {pub}
distributor: {dist}
subscribers:
  sub1: {sub}
snapshot_folder: snaps
publications:
  - name: p
    articles:
      - public.orders
      - table: public.items
        row_filter: "qty > 0"
        columns: [id, qty]
subscriptions:
  - publication: p
    subscriber: sub1
    commit_batch_size: 10
"""
LONG = "o" * 64
ITEMS_END = "        columns: [id, qty]\n"  # the last line (12) of the items article
SUB_END = "    commit_batch_size: 10\n"  # the last line (16) of the subscription


@dataclass(frozen=True)
class Case:
    """``old`` -> ``new`` in BASE (``old`` must occur once); the error must be at ``line`` (None:
    no position) and name ``path``, and say ``says``."""

    id: str
    old: str
    new: str
    line: int | None
    path: str
    says: str


def case(id: str, old: str, new: str, line: int | None, path: str, says: str):
    return pytest.param(Case(id, old, new, line, path, says), id=id)


CASES = [
    # -- identifiers: PostgreSQL's 63-byte limit, NUL, quotes, empty parts
    case(
        "table_64_bytes",
        "public.orders",
        f"public.{LONG}",
        9,
        "publications[0].articles[0].table",
        f"table name '{LONG}' is 64 bytes long",
    ),
    case(
        "table_64_bytes_utf8",
        "public.orders",
        "public." + "é" * 32,
        9,
        "publications[0].articles[0].table",
        "is 64 bytes long",
    ),
    case(
        "schema_64_bytes",
        "public.orders",
        f"{LONG}.orders",
        9,
        "publications[0].articles[0].table",
        "schema name 'oooo",
    ),
    case(
        "destination_64_bytes",
        ITEMS_END,
        ITEMS_END + f"        destination: copy.{LONG}\n",
        13,
        "publications[0].articles[1].destination",
        "destination table name",
    ),
    case(
        "column_64_bytes",
        "columns: [id, qty]",
        f"columns: [id, {LONG}]",
        12,
        "publications[0].articles[1].columns[1]",
        "column name",
    ),
    case(
        "article_name_64_bytes",
        ITEMS_END,
        ITEMS_END + f"        name: {LONG}\n",
        13,
        "publications[0].articles[1].name",
        "is 64 bytes long",
    ),
    case(
        "article_name_with_slash",
        ITEMS_END,
        ITEMS_END + "        name: ../items\n",
        13,
        "publications[0].articles[1].name",
        "folder of snapshot files",
    ),
    case("table_nul", "public.orders", '"public.ord\\0ers"', 9, "publications[0].articles[0].table", "NUL character"),
    case(
        "table_three_parts",
        "public.orders",
        "db.public.orders",
        9,
        "publications[0].articles[0].table",
        "not of the form schema.table",
    ),
    case("table_empty_part", "public.orders", "public.", 9, "publications[0].articles[0].table", "table name is empty"),
    case(
        "publication_name_41",
        "- name: p\n",
        f"- name: {'p' * 41}\n",
        7,
        "publications[0].name",
        "is invalid: use 1-40 lower-case",
    ),
    case("publication_name_upper", "- name: p\n", "- name: Shop\n", 7, "publications[0].name", "'Shop' is invalid"),
    case(
        "subscriber_name_bad",
        "  sub1: {sub}",
        "  sub1: {sub}\n  Sub-2: other",
        5,
        "subscribers['Sub-2']",
        "subscriber name 'Sub-2' is invalid",
    ),
    # -- shapes
    case(
        "articles_as_mapping",
        '      - public.orders\n      - table: public.items\n        row_filter: "qty > 0"\n'
        "        columns: [id, qty]\n",
        '      table: public.items\n      row_filter: "qty > 0"\n      columns: [id, qty]\n',
        9,
        "publications[0].articles",
        "expected a list, got a mapping",
    ),
    case(
        "articles_empty",
        "    articles:\n      - public.orders\n      - table: public.items\n"
        '        row_filter: "qty > 0"\n        columns: [id, qty]\n',
        "    articles: []\n",
        8,
        "publications[0].articles",
        "the list is empty",
    ),
    case(
        "article_is_number",
        "- public.orders",
        "- 42",
        9,
        "publications[0].articles[0]",
        "an article must be a table name",
    ),
    case(
        "article_without_table",
        "- table: public.items",
        "- name: items",
        10,
        "publications[0].articles[1]",
        "required key 'table' is missing",
    ),
    case(
        "publications_as_string",
        "publications:\n  - name: p\n",
        "publications: p\nx:\n  - name: p\n",
        6,
        "publications",
        "expected a list, got the string 'p'",
    ),
    case(
        "subscribers_as_list",
        "subscribers:\n  sub1: {sub}",
        "subscribers:\n  - {sub}",
        4,
        "subscribers",
        "expected a mapping, got a list",
    ),
    case(
        "snapshot_folder_list",
        "snapshot_folder: snaps",
        "snapshot_folder: [a, b]",
        5,
        "snapshot_folder",
        "expected a string, got a list",
    ),
    case("top_level_list", BASE, "- a\n- b\n", 1, "(top level)", "a topology must be a mapping"),
    case(
        "server_mapping_unknown_key",
        "  sub1: {sub}",
        "  sub1: {uri: '{sub}', port: 5}",
        4,
        "subscribers.sub1.port",
        "unknown key 'port'; known keys here: conn_id, uri",
    ),
    case(
        "server_mapping_without_reference", "  sub1: {sub}", "  sub1: {host: h}", 4, "subscribers.sub1", "needs conn_id"
    ),
    case(
        "server_is_number",
        "distributor: {dist}",
        "distributor: 5",
        2,
        "distributor",
        "a server must be an Airflow connection id",
    ),
    case(
        "server_scheme_mysql",
        "distributor: {dist}",
        "distributor: mysql://u@h/d",
        2,
        "distributor",
        "a MariaDB server cannot be the distributor: it must be PostgreSQL",
    ),
    case(
        "server_empty", "distributor: {dist}", "distributor: ''", 2, "distributor", "not a valid Airflow connection id"
    ),
    case(
        "publisher_connection_id_undefined",
        "publisher: {pub}",
        "publisher: airflow_repl_nope",
        1,
        "publisher",
        "connection id 'airflow_repl_nope' is not defined (looked up in the metadata database of AIRFLOW_HOME=",
    ),
    case(
        "subscriber_connection_id_undefined",
        "  sub1: {sub}",
        "  sub1: {conn_id: airflow_repl_nope}",
        4,
        "subscribers.sub1",
        "connection id 'airflow_repl_nope' is not defined",
    ),
    # -- unknown and duplicate keys
    case(
        "unknown_top_key", SUB_END, SUB_END + "subscription: []\n", 17, "subscription", "did you mean 'subscriptions'?"
    ),
    case(
        "unknown_article_key",
        ITEMS_END,
        ITEMS_END + "        colour: red\n",
        13,
        "publications[0].articles[1].colour",
        "unknown key 'colour'",
    ),
    case(
        "unknown_publication_key",
        "- name: p\n",
        "- name: p\n    owner: me\n",
        8,
        "publications[0].owner",
        "unknown key 'owner'",
    ),
    case(
        "unknown_subscription_key",
        SUB_END,
        SUB_END + "    commit_batch: 5\n",
        17,
        "subscriptions[0].commit_batch",
        "did you mean 'commit_batch_size'?",
    ),
    case(
        "duplicate_key_article",
        ITEMS_END,
        ITEMS_END + '        row_filter: "qty > 1"\n',
        13,
        "publications[0].articles[1]",
        "duplicate key 'row_filter' (also at line 11",
    ),
    case(
        "duplicate_key_top",
        SUB_END,
        SUB_END + "publisher: other\n",
        17,
        "(top level)",
        "duplicate key 'publisher' (also at line 1",
    ),
    case(
        "duplicate_subscriber",
        "  sub1: {sub}",
        "  sub1: {sub}\n  sub1: other",
        5,
        "subscribers",
        "duplicate key 'sub1'",
    ),
    # -- types and ranges
    case(
        "streams_true",
        SUB_END,
        SUB_END + "    subscription_streams: true\n",
        17,
        "subscriptions[0].subscription_streams",
        "expected an integer, got the boolean true",
    ),
    case(
        "streams_quoted",
        SUB_END,
        SUB_END + "    subscription_streams: '4'\n",
        17,
        "subscriptions[0].subscription_streams",
        "write the number without quotes",
    ),
    case(
        "streams_65",
        SUB_END,
        SUB_END + "    subscription_streams: 65\n",
        17,
        "subscriptions[0].subscription_streams",
        "65 is out of range: use an integer from 1 to 64",
    ),
    case(
        "batch_size_zero",
        "commit_batch_size: 10",
        "commit_batch_size: 0",
        16,
        "subscriptions[0].commit_batch_size",
        "0 is out of range: use an integer from 1 to 1000000",
    ),
    case(
        "batch_size_huge",
        "commit_batch_size: 10",
        "commit_batch_size: 100000000000000000000",
        16,
        "subscriptions[0].commit_batch_size",
        "100000000000000000000 is out of range",
    ),
    case(
        "threshold_float",
        SUB_END,
        SUB_END + "    commit_batch_threshold: 1.5\n",
        17,
        "subscriptions[0].commit_batch_threshold",
        "expected an integer, got the number 1.5; write a whole number",
    ),
    case(
        "skip_errors_unknown",
        SUB_END,
        SUB_END + "    skip_errors: [row_not_found, everything]\n",
        17,
        "subscriptions[0].skip_errors[1]",
        "'everything' is not an error that can be skipped",
    ),
    case(
        "skip_errors_not_list",
        SUB_END,
        SUB_END + "    skip_errors: row_not_found\n",
        17,
        "subscriptions[0].skip_errors",
        "expected a list",
    ),
    case(
        "subscriber_is_boolean",
        "subscriber: sub1",
        "subscriber: no",
        15,
        "subscriptions[0].subscriber",
        "got the boolean false; YAML reads unquoted",
    ),
    case(
        "include_children_string",
        ITEMS_END,
        ITEMS_END + "        include_children: 'yes'\n",
        13,
        "publications[0].articles[1].include_children",
        "expected true or false",
    ),
    case(
        "include_children_int",
        ITEMS_END,
        ITEMS_END + "        include_children: 1\n",
        13,
        "publications[0].articles[1].include_children",
        "got the integer 1",
    ),
    case(
        "update_mode_unknown",
        "- name: p\n",
        "- name: p\n    updates_as_delete_insert: some\n",
        8,
        "publications[0].updates_as_delete_insert",
        "'some' is not allowed; choose one of",
    ),
    case(
        "snapshot_folder_unset_var",
        "snapshot_folder: snaps",
        "snapshot_folder: ${AIRFLOW_REPL_TEST_UNSET}",
        5,
        "snapshot_folder",
        "uses ${AIRFLOW_REPL_TEST_UNSET}, which is not set",
    ),
    # -- filters and propagation
    case(
        "row_filter_semicolon",
        '"qty > 0"',
        '"qty > 0; DROP TABLE items"',
        11,
        "publications[0].articles[1].row_filter",
        "of article 'items' is not a valid predicate: ';' is not allowed",
    ),
    case(
        "row_filter_comment",
        '"qty > 0"',
        '"qty > 0 -- x"',
        11,
        "publications[0].articles[1].row_filter",
        "comments are not allowed",
    ),
    case(
        "row_filter_unbalanced",
        '"qty > 0"',
        '"(qty > 0"',
        11,
        "publications[0].articles[1].row_filter",
        "unbalanced parentheses",
    ),
    case(
        "row_filter_number",
        '"qty > 0"',
        "5",
        11,
        "publications[0].articles[1].row_filter",
        "expected a string, got the integer 5",
    ),
    case(
        "columns_twice",
        "columns: [id, qty]",
        "columns: [id, qty, id]",
        12,
        "publications[0].articles[1].columns[2]",
        "column 'id' is listed twice",
    ),
    case(
        "columns_empty",
        "columns: [id, qty]",
        "columns: []",
        12,
        "publications[0].articles[1].columns",
        "the list is empty",
    ),
    case(
        "columns_string",
        "columns: [id, qty]",
        "columns: id",
        12,
        "publications[0].articles[1].columns",
        "expected a list",
    ),
    case(
        "ins_cmd_scall",
        ITEMS_END,
        ITEMS_END + "        ins_cmd: SCALL\n",
        13,
        "publications[0].articles[1].ins_cmd",
        "SCALL is not allowed for inserts",
    ),
    case(
        "upd_cmd_vcall",
        ITEMS_END,
        ITEMS_END + "        upd_cmd: VCALL\n",
        13,
        "publications[0].articles[1].upd_cmd",
        "reserved for updatable subscriptions",
    ),
    case(
        "del_cmd_bad_procedure",
        ITEMS_END,
        ITEMS_END + "        del_cmd: 'XCALL a;b'\n",
        13,
        "publications[0].articles[1].del_cmd",
        "not a valid procedure name",
    ),
    # -- references and duplicates across the file
    case(
        "subscription_unknown_publication",
        "- publication: p",
        "- publication: q",
        14,
        "subscriptions[0].publication",
        "unknown publication 'q'",
    ),
    case(
        "subscription_unknown_subscriber",
        "subscriber: sub1",
        "subscriber: sub9",
        15,
        "subscriptions[0].subscriber",
        "unknown subscriber 'sub9'",
    ),
    case(
        "subscription_twice",
        SUB_END,
        SUB_END + "  - {publication: p, subscriber: sub1}\n",
        17,
        "subscriptions[1]",
        "subscribes to publication 'p' twice",
    ),
    case(
        "publication_twice",
        "subscriptions:\n",
        "  - {name: p, articles: [public.other]}\nsubscriptions:\n",
        13,
        "publications[1].name",
        "publication 'p' is defined twice",
    ),
    case(
        "article_table_twice",
        ITEMS_END,
        ITEMS_END + "      - {table: orders, name: o2, destination: copy.o2}\n",
        13,
        "publications[0].articles[2].table",
        "table public.orders is published twice",
    ),
    case(
        "article_destination_twice",
        ITEMS_END,
        ITEMS_END + "      - {table: other, destination: public.items}\n",
        13,
        "publications[0].articles[2].destination",
        "two articles would write the same subscriber table",
    ),
    # -- YAML syntax
    case(
        "yaml_mapping_in_value",
        "snapshot_folder: snaps",
        "snapshot_folder: snaps: x",
        5,
        "invalid YAML",
        "mapping values are not allowed here",
    ),
    case("yaml_tab", "  sub1: {sub}", "\tsub1: {sub}", 4, "invalid YAML", "found character '\\t'"),
    case(
        "yaml_unterminated_quote",
        '"qty > 0"',
        '"qty > 0',
        17,
        "invalid YAML",
        "while scanning a quoted scalar at line 11",
    ),
    case("yaml_two_documents", SUB_END, SUB_END + "---\nother: 1\n", 17, "invalid YAML", "expected a single document"),
    case(
        "yaml_nul_byte",
        "snapshot_folder: snaps",
        "snapshot_folder: sn\0aps",
        5,
        "invalid YAML",
        "character #x0000 is not allowed",
    ),
    case(
        "yaml_recursive_alias",
        "snapshot_folder: snaps",
        "snapshot_folder: &a [*a]",
        5,
        "snapshot_folder",
        "expected a string, got a list",
    ),
]


def _symlink_loop(path: Path) -> Path:
    path.symlink_to(path)
    return path


def _socket(path: Path) -> Path:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return path


#: File problems: (id, make the path in a directory, what the message says).
FILE_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("missing", lambda d: d / "missing.yaml", "does not exist: check the path"),
    ("directory", lambda d: d, "is a directory"),
    ("symlink_loop", lambda d: _symlink_loop(d / "loop.yaml"), "cannot be read: Too many levels of symbolic links"),
    ("socket", lambda d: _socket(d / "t.sock"), "cannot be read"),
    ("not_utf8", lambda d: _write(d / "t.yaml", "publisher: caf\xe9\n".encode("latin-1")), ":1: is not UTF-8 text"),
    ("empty", lambda d: _write(d / "t.yaml", b""), "is empty"),
    ("only_comments", lambda d: _write(d / "t.yaml", b"# nothing yet\n\n"), "is empty"),
]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def state(env: Env) -> dict[str, list[tuple]]:
    """Everything a (failed) apply could have changed, at the three databases."""
    dist_tables = env.rows(
        env.dist,
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'airflow_repl' AND c.relkind = 'r' ORDER BY 1",
    )
    return {
        "publications": env.rows(env.pub, "SELECT pubname FROM pg_publication ORDER BY 1"),
        "published_tables": env.rows(env.pub, "SELECT pubname, tablename FROM pg_publication_tables ORDER BY 1, 2"),
        "slots": env.rows(env.pub, "SELECT slot_name FROM pg_replication_slots ORDER BY 1"),
        "replica_identity": env.rows(
            env.pub,
            "SELECT relname, relreplident FROM pg_class "
            "WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' ORDER BY 1",
        ),
        "dist_schemas": env.rows(
            env.dist,
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
            "AND nspname <> 'information_schema' ORDER BY 1",
        ),
        "dist_rows": [
            (t, env.rows(env.dist, f'SELECT count(*) FROM airflow_repl."{t}"')[0][0]) for (t,) in dist_tables
        ],
        "sub_objects": env.rows(
            env.sub,
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname NOT LIKE 'pg\\_%' "
            "AND n.nspname <> 'information_schema' ORDER BY 1, 2",
        ),
        "sub_procedures": env.rows(
            env.sub,
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1",
        ),
        "sub_rows": env.rows(env.sub, "SELECT id, qty FROM public.items ORDER BY id"),
    }


@pytest.fixture(scope="module")
def servers(sandbox, tmp_path_factory):
    """One set of databases for every case: a failed apply must leave them as they are, which each
    case checks; the tables exist, so a valid topology would deploy (see the control test)."""
    e = Env(sandbox, tmp_path_factory.mktemp("topology-validation"))
    _prepare(e)
    yield e
    e.drop()


def _prepare(e: Env) -> None:
    e.run(
        e.pub,
        "CREATE TABLE orders (id int PRIMARY KEY, v text); CREATE TABLE other (id int PRIMARY KEY); "
        "CREATE TABLE items (id int PRIMARY KEY, qty int, note text); "
        "INSERT INTO items SELECT g, g % 3, 'n' FROM generate_series(1, 20) g",
    )
    e.run(e.sub, "CREATE TABLE items (id int PRIMARY KEY, qty int); INSERT INTO items VALUES (1, 1), (2, 2)")


def _fill(text: str, e: Env) -> str:
    return text.replace("{pub}", to_uri(e.pub)).replace("{dist}", to_uri(e.dist)).replace("{sub}", to_uri(e.sub))


def _base(e: Env) -> str:
    return _fill(BASE, e)


def _apply(path: Path | str, capsys) -> tuple[int, str, str]:
    code = cli.main(["apply", "-t", str(path)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _assert_one_error_line(code: int, out: str, err: str, prefix: str, says: str) -> str:
    assert code == 2, (code, err)
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("airflow-repl: error: " + prefix), lines[0]
    assert says in lines[0], lines[0]
    return lines[0]


def test_the_valid_base_topology_deploys_and_changes_the_state(env, tmp_path, capsys):
    """The control: the state helper sees what apply changes, so 'unchanged' below means something."""
    _prepare(env)
    before = state(env)
    path = tmp_path / "t.yaml"
    path.write_text(_base(env))
    code, _out, err = _apply(path, capsys)
    assert code == 0, err
    after = state(env)
    assert after["publications"] == [("airflow_repl_p",)] and before["publications"] == []
    assert after["published_tables"] == [("airflow_repl_p", "items"), ("airflow_repl_p", "orders")]
    assert ("airflow_repl",) in after["dist_schemas"] and ("airflow_repl",) not in before["dist_schemas"]
    assert dict(after["dist_rows"])["articles"] == 2


@pytest.mark.parametrize("c", CASES)
def test_bad_topology_is_one_line_and_changes_nothing(servers, tmp_path, capsys, monkeypatch, c: Case):
    monkeypatch.delenv("AIRFLOW_REPL_TEST_UNSET", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_AIRFLOW_REPL_NOPE", raising=False)
    base, old, new = _base(servers), _fill(c.old, servers), _fill(c.new, servers)
    assert base.count(old) == 1, f"case {c.id}: {old!r} must occur once in the base topology"
    path = tmp_path / "t.yaml"
    path.write_text(base.replace(old, new))
    before = state(servers)
    code, out, err = _apply(path, capsys)
    line = _assert_one_error_line(code, out, err, f"topology file {path}:", c.says)
    m = re.match(rf"airflow-repl: error: topology file {re.escape(str(path))}:(\d+):(\d+): (.*)$", line)
    assert m, line
    assert int(m.group(1)) == c.line, line
    assert m.group(3).startswith(f"{c.path}: "), line
    assert "pw" not in line and "password" not in line  # sandbox URIs carry no password; none is quoted anyway
    assert state(servers) == before


@pytest.mark.parametrize("make, says", [pytest.param(m, s, id=i) for i, m, s in FILE_CASES])
def test_bad_topology_file_is_one_line_and_changes_nothing(servers, tmp_path, capsys, make, says):
    path = make(tmp_path)
    before = state(servers)
    code, out, err = _apply(path, capsys)
    _assert_one_error_line(code, out, err, f"topology file {path}", says)
    assert state(servers) == before


def test_unreadable_file_is_one_line_and_changes_nothing(servers, tmp_path):
    """A file without read permission, read by the real command line in its own process.  Root
    reads any file, so as root the process runs without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH."""
    path = tmp_path / "t.yaml"
    path.write_text(_base(servers))
    path.chmod(0)
    command = [sys.executable, "-m", "airflow_repl.cli", "apply", "-t", str(path)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: root can read any file")
        command = [
            "setpriv",
            "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search",
            "--",
            *command,
        ]
    repo = str(Path(cli.__file__).resolve().parents[2])
    before = state(servers)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": repo})
    _assert_one_error_line(
        done.returncode,
        done.stdout,
        done.stderr,
        f"topology file {path}",
        "cannot be read: Permission denied; check the path and its permissions",
    )
    assert state(servers) == before


@pytest.mark.parametrize(
    "command", [["snapshot"], ["logreader"], ["distribution", "--subscriber", "sub1"], ["validate"], ["script-procs"]]
)
def test_every_command_rejects_a_bad_topology_before_touching_a_server(servers, tmp_path, capsys, command):
    """The agents load the file the same way: the Snapshot Agent would otherwise create a slot."""
    path = tmp_path / "t.yaml"
    path.write_text(_base(servers).replace("commit_batch_size: 10", "commit_batch_size: true"))
    before = state(servers)
    code = cli.main([*command, "-t", str(path)])
    out = capsys.readouterr()
    _assert_one_error_line(
        code,
        out.out,
        out.err,
        f"topology file {path}:16:24: subscriptions[0].commit_batch_size: ",
        "expected an integer, got the boolean true",
    )
    assert state(servers) == before


def test_only_the_first_problem_is_reported_with_a_count_of_the_rest(servers, tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text(
        _base(servers)
        .replace("commit_batch_size: 10", "commit_batch_size: 0\n    colour: red")
        .replace("public.orders", f"public.{LONG}")
    )
    before = state(servers)
    code, out, err = _apply(path, capsys)
    line = _assert_one_error_line(code, out, err, f"topology file {path}:9:", "64 bytes long")
    assert line.endswith("(and 2 more)")  # the first by position in the file
    assert state(servers) == before


@pytest.mark.parametrize(
    "row_filter, says",
    [
        ("id > random()", "User-defined or built-in mutable functions are not allowed"),
        ("ctid > '(0,0)'", "System columns are not allowed"),
        ("id > (SELECT 0)", "Only columns, constants, built-in operators"),
    ],
)
def test_a_row_filter_only_a_publication_rejects_names_its_article_and_changes_nothing(
    servers, tmp_path, capsys, row_filter, says
):
    """A filter that is a valid condition but not a valid publication row filter: the line names
    the article, its table and the filter (two articles have filters), and nothing changes."""
    path = tmp_path / "t.yaml"
    path.write_text(
        _base(servers)
        .replace("      - public.orders\n", f'      - table: public.orders\n        row_filter: "{row_filter}"\n')
        .replace("qty > 0", "qty > 0 AND note <> 'x'")
    )
    before = state(servers)
    code, out, err = _apply(path, capsys)
    line = _assert_one_error_line(
        code,
        out,
        err,
        "row_filter of article 'orders' (public.orders) is rejected by the publisher: invalid publication WHERE "
        "expression",
        says,
    )
    assert line.endswith(f"; the filter: {row_filter!r}"), line
    assert state(servers) == before
