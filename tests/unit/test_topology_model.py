"""The topology model and the YAML reader, without any server: types, ranges, names, positions."""

from __future__ import annotations

import pytest

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import naming, topology, yaml_source
from airflow_repl.engine.model.propagation import parse_propagation
from airflow_repl.engine.postgres import connections


def _data(**over):
    data = {
        "publisher": "pub_conn",
        "distributor": "postgresql://repl@db:5432/distribution",
        "subscribers": {"s1": "sub_conn"},
        "publications": [{"name": "shop", "articles": ["public.orders"]}],
        "subscriptions": [{"publication": "shop", "subscriber": "s1"}],
    }
    data.update(over)
    return data


def _article(**options):
    return _data(publications=[{"name": "shop", "articles": [{"table": "public.orders", **options}]}])


def _sub(**options):
    return _data(subscriptions=[{"publication": "shop", "subscriber": "s1", **options}])


def _error(data) -> str:
    with pytest.raises(TopologyError) as err:
        topology.from_dict(data)
    message = str(err.value)
    assert "\n" not in message and message.startswith("topology: ")
    return message


# ---------------------------------------------------------------------- names
def test_names_are_used_as_written_quotes_spaces_and_case_included():
    art = topology.from_dict(_article(table='My Schema.Mixed "Case" %Table')).publication("shop").articles[0]
    assert (art.source_schema, art.source_table) == ("My Schema", 'Mixed "Case" %Table')


@pytest.mark.parametrize("name, size", [("a" * 63, 63), ("€" * 21, 63), ("é" * 31 + "a", 63)])
def test_names_of_exactly_63_bytes_are_accepted(name, size):
    assert len(name.encode()) == size
    art = (
        topology.from_dict(_article(table=f"{name}.{name}", destination=f"{name}.{name}", columns=[name], name=name))
        .publication("shop")
        .articles[0]
    )
    assert (art.source_schema, art.source_table, art.dest_schema, art.dest_table, art.name) == (name,) * 5
    assert art.columns == [name]


@pytest.mark.parametrize("name", ["a" * 64, "€" * 22, "é" * 32])
@pytest.mark.parametrize(
    "where, build",
    [
        ("publications[0].articles[0].table: table name", lambda n: _article(table=f"public.{n}")),
        ("publications[0].articles[0].table: schema name", lambda n: _article(table=f"{n}.orders")),
        ("publications[0].articles[0].destination: destination table name", lambda n: _article(destination=n)),
        ("publications[0].articles[0].columns[0]: column name", lambda n: _article(columns=[n])),
    ],
)
def test_names_over_63_bytes_are_rejected_never_truncated(name, where, build):
    message = _error(build(name))
    assert f"topology: {where} {name!r} is {len(name.encode())} bytes long" in message
    assert "at most 63 bytes" in message


def test_long_names_that_truncate_onto_each_other_are_rejected_not_merged():
    # PostgreSQL would read both as the same 63-byte name
    base = "t" * 63
    message = _error(_data(publications=[{"name": "shop", "articles": [f"public.{base}x", f"public.{base}y"]}]))
    assert "publications[0].articles[0].table" in message


@pytest.mark.parametrize("name", ["p" * 40, "a", "a_1"])
def test_valid_publication_names_give_server_names_within_63_bytes(name):
    topology.from_dict(_data(publications=[{"name": name, "articles": ["t"]}], subscriptions=[]))
    assert len(naming.slot(name, "any database").encode()) <= 63
    assert len(naming.pg_publication(name).encode()) <= 63


@pytest.mark.parametrize("name", ["p" * 41, "Shop", "1shop", "shop-x", "", "ß", "shop\n"])
def test_invalid_publication_names(name):
    assert "publications[0].name: publication name" in _error(
        _data(publications=[{"name": name, "articles": ["t"]}], subscriptions=[])
    )


@pytest.mark.parametrize(
    "table, says",
    [
        ("a.b.c", "not of the form schema.table"),
        (".t", "schema name is empty"),
        ("s.", "table name is empty"),
        ("s.t\x00", "NUL character"),
    ],
)
def test_bad_table_names(table, says):
    assert says in _error(_article(table=table))


def test_article_name_cannot_leave_its_snapshot_folder():
    for name in ("../x", "a/b", "..", "."):
        assert "names a folder of snapshot files" in _error(_article(name=name))


# ---------------------------------------------------------------------- strict types and ranges
@pytest.mark.parametrize("option", sorted(topology.RANGES))
def test_integer_options_accept_their_whole_range_and_nothing_else(option):
    low, high = topology.RANGES[option]
    for good in (low, high):
        assert getattr(topology.from_dict(_sub(**{option: good})).subscriptions[0], option) == good
    for bad in (low - 1, high + 1, 10**20):
        assert f"subscriptions[0].{option}: {bad} is out of range: use an integer from {low} to {high}" in _error(
            _sub(**{option: bad})
        )
    for bad, says in (
        (True, "got the boolean true"),
        ("4", "got the string '4'"),
        (4.0, "got the number 4.0"),
        (None, "got nothing (null)"),
    ):
        assert f"subscriptions[0].{option}: expected an integer, {says}" in _error(_sub(**{option: bad}))


def test_documented_ranges():
    assert topology.RANGES == {
        "commit_batch_size": (1, 1_000_000),
        "commit_batch_threshold": (1, 10_000_000),
        "subscription_streams": (1, 64),
    }


def test_strings_are_not_numbers_or_booleans():
    assert "subscriptions[0].subscriber: expected a string, got the boolean false; YAML reads" in _error(
        _sub(subscriber=False)
    )
    assert "publications[0].name: expected a string, got the integer 7" in _error(
        _data(publications=[{"name": 7, "articles": ["t"]}])
    )
    assert "snapshot_folder: expected a string, got a list" in _error(_data(snapshot_folder=["a"]))


def test_skip_errors_accept_names_and_sql_server_numbers():
    sub = topology.from_dict(_sub(skip_errors=["row_not_found", 2627, "20598"])).subscriptions[0]
    assert sub.skip_errors == ["row_not_found", "2627", "20598"]
    assert all(e in topology.SKIPPABLE_ERRORS for e in sub.skip_errors)
    assert (
        "skip_errors[0]: the integer 1 is not an error that can be skipped: skip_errors of a subscription "
        "must list some of: row_not_found (20598), duplicate_key (2627)" in _error(_sub(skip_errors=[1]))
    )
    assert "skip_errors[0]: the boolean true is not an error" in _error(_sub(skip_errors=[True]))


def test_include_children_is_a_strict_boolean_defaulting_to_false():
    topo = topology.from_dict(
        _data(
            publications=[{"name": "shop", "articles": ["public.a", {"table": "public.b", "include_children": True}]}]
        )
    )
    a, b = topo.publication("shop").articles
    assert (a.include_children, b.include_children) == (False, True)
    assert [x["include_children"] for x in topo.to_dict()["publications"][0]["articles"]] == [False, True]
    for bad in ("yes", 1, None):
        assert "articles[0].include_children: expected true or false" in _error(_article(include_children=bad))


# ---------------------------------------------------------------------- shapes and keys
@pytest.mark.parametrize(
    "mutate, says",
    [
        (lambda d: d.update(publications={"name": "shop"}), "publications: expected a list, got a mapping"),
        (
            lambda d: d["publications"][0].update(articles={"table": "t", "row_filter": "x > 1"}),
            "publications[0].articles: expected a list, got a mapping; write each entry as a list item",
        ),
        (lambda d: d["publications"][0].update(articles=[]), "publications[0].articles: the list is empty"),
        (lambda d: d.update(publications=[]), "publications: the list is empty"),
        (lambda d: d["publications"][0]["articles"].append(["t"]), "articles[1]: an article must be a table name"),
        (lambda d: d.update(subscribers=None), "subscribers: expected a mapping, got nothing (null)"),
        (
            lambda d: d.update(subscribers={"s1": {"conn_id": "x", "host": "h"}}),
            "subscribers.s1.host: unknown key 'host'; known keys here: conn_id, uri",
        ),
        (
            lambda d: d.update(subscribers={"s1": {"conn_id": "x", "uri": "postgresql://h/d"}}),
            "subscribers.s1.uri: unknown key 'uri'",
        ),
        (lambda d: d.update(subscribers={"s1": {}}), "subscribers.s1: a server mapping needs conn_id"),
        (lambda d: d.update(publisher=["x"]), "publisher: a server must be an Airflow connection id"),
        (lambda d: d.update(publisher="mysql://u@h/d"), "publisher: a MariaDB server cannot be the publisher"),
        (lambda d: d.update(publisher="oracle://u@h/d"), "publisher: connection URI scheme 'oracle' is not supported"),
        (
            lambda d: d.update(publisher="has space"),
            "publisher: the server reference is not a valid Airflow connection",
        ),
        (lambda d: d.update(subscribers={"S1": "x"}), "subscribers.S1: subscriber name 'S1' is invalid"),
        (lambda d: d.update(subscribers={1: "x"}), "subscribers[1]: expected a string, got the integer 1"),
        (lambda d: d.pop("publisher"), "topology: (top level): required key 'publisher' is missing"),
        (
            lambda d: d["publications"][0]["articles"].append({"name": "x"}),
            "publications[0].articles[1]: required key 'table' is missing",
        ),
        (lambda d: d.update(publisher_=1), "unknown key 'publisher_'; did you mean 'publisher'?"),
    ],
)
def test_shapes_and_unknown_keys(mutate, says):
    data = _data()
    mutate(data)
    assert says in _error(data)


def test_a_non_mapping_topology():
    for value in ([], "x", None, 5):
        assert "topology: (top level): a topology must be a mapping" in _error(value)


def test_uri_password_never_in_a_message():
    message = _error(_data(publisher={"uri": "postgresql://u:s3cret@h/d", "port": 1}))
    assert "publisher.port: unknown key" in message and "s3cret" not in message
    message = _error(_sub(commit_batch_size="postgresql://u:s3cret@h/d"))
    assert "got a string" in message and "s3cret" not in message


def test_server_forms():
    topo = topology.from_dict(
        _data(
            subscribers={
                "a": {"conn_id": "x_conn"},
                "b": {"uri": "postgresql://u:pw@h/d"},
                "c": {"ref": "c_conn", "conninfo": "host=h password=pw"},
            },
            subscriptions=[],
        )
    )
    assert [topo.subscribers[k].ref for k in "abc"] == ["x_conn", "postgresql://u:pw@h/d", "c_conn"]
    assert topo.subscribers["c"].conninfo == "host=h password=pw"
    assert "pw" not in repr(topo) and "pw" not in str(topo.subscribers["b"])


def test_defaults_and_normalised_names():
    topo = topology.from_dict(
        _data(
            publications=[
                {
                    "name": "shop",
                    "updates_as_delete_insert": "all",
                    "articles": [
                        "orders",
                        {"table": "crm.customers", "destination": "clients", "updates_as_delete_insert": "key_changes"},
                    ],
                }
            ]
        )
    )
    orders, customers = topo.publication("shop").articles
    assert (orders.name, orders.source, orders.destination) == ("orders", "public.orders", "public.orders")
    assert (customers.name, customers.source, customers.destination) == ("customers", "crm.customers", "crm.clients")
    assert (orders.updates_as_delete_insert, customers.updates_as_delete_insert) == ("all", "key_changes")
    assert orders.ins_cmd == parse_propagation("insert", None) and orders.upd_cmd.syntax == "SCALL"
    sub = topo.subscription("shop", "s1")
    assert (sub.commit_batch_size, sub.commit_batch_threshold, sub.subscription_streams, sub.skip_errors) == (
        100,
        1000,
        1,
        [],
    )
    assert sub.options() == {
        "commit_batch_size": 100,
        "commit_batch_threshold": 1000,
        "subscription_streams": 1,
        "skip_errors": [],
        "bulk_apply": False,
    }


def test_to_dict_round_trips_through_from_dict():
    topo = topology.from_dict(
        _data(
            publications=[
                {
                    "name": "shop",
                    "articles": [
                        {
                            "table": "public.orders",
                            "row_filter": "id > 1",
                            "columns": ["a", "b"],
                            "include_children": True,
                            "upd_cmd": "MCALL audit.upd",
                            "del_cmd": "NONE",
                            "ins_cmd": "SQL",
                        }
                    ],
                }
            ],
            subscriptions=[
                {"publication": "shop", "subscriber": "s1", "subscription_streams": 3, "skip_errors": ["duplicate_key"]}
            ],
        )
    )
    topo.resolve(lambda ref: f"host=h dbname={ref}")
    spec = topo.to_dict(with_secrets=True)
    again = topology.from_dict(spec)
    assert again.to_dict(with_secrets=True) == spec
    art = again.publication("shop").articles[0]
    assert (art.upd_cmd.procedure, art.del_cmd.method, art.ins_cmd.method) == ("audit.upd", "none", "sql")


def test_first_problem_by_position_and_a_count_of_the_rest(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "publisher: a\ndistributor: b\nsubscriptions:\n  - {publication: shop, subscriber: s1, "
        "subscription_streams: 0}\npublications:\n  - name: shop\n    articles: [public.orders]\n"
        "    bogus: 1\n"
    )
    with pytest.raises(TopologyError) as err:
        topology.load(path)
    # pydantic reports publications first (field order); the file has the subscription first
    assert str(err.value).startswith(f"topology file {path}:4:63: subscriptions[0].subscription_streams: 0 is out")
    assert str(err.value).endswith("(and 1 more)")


# ---------------------------------------------------------------------- the YAML reader
def test_positions_of_values_keys_and_missing_keys():
    src = yaml_source.parse("a:\n  b: [1, {c: 2}]\n  d:\n    - x\n", "f.yaml")
    assert src.data == {"a": {"b": [1, {"c": 2}], "d": ["x"]}}
    assert str(src.position(("a", "b", 1, "c"))) == "2:14"
    assert str(src.position(("a", "b", 1, "c"), key=True)) == "2:11"
    assert str(src.position(("a", "d", 0))) == "4:7"
    assert str(src.position(("a", "b", 1, "missing"))) == "2:10"  # the mapping it belongs in
    assert src.where(("a", "d")) == "topology file f.yaml:4:5"


def test_duplicate_keys_name_both_lines_at_any_depth():
    with pytest.raises(
        TopologyError,
        match=r"^topology file f.yaml:3:3: a: duplicate key 'b' \(also at line 2, "
        r"column 3\); YAML would keep only the last one",
    ):
        yaml_source.parse("a:\n  b: 1\n  b: 2\n", "f.yaml")
    with pytest.raises(TopologyError, match=r"f.yaml:1:12: x\[0\]: duplicate key 'k'"):
        yaml_source.parse("x: [{k: 1, k: 1}]\n", "f.yaml")
    with pytest.raises(TopologyError, match="duplicate key True"):  # yes and on are the same boolean key
        yaml_source.parse("yes: 1\non: 2\n", "f.yaml")


def test_merge_keys_may_be_overridden_without_a_duplicate_error():
    src = yaml_source.parse("base: &b {x: 1, y: [a]}\nc:\n  <<: *b\n  y:\n    - b\n", "f.yaml")
    assert src.data["c"] == {"x": 1, "y": ["b"]}
    assert str(src.position(("c", "y"))) == "5:5" and str(src.position(("c", "y", 0))) == "5:7"
    assert str(src.position(("c", "x"))) == "1:14"  # merged from the anchor


def test_yaml_errors_are_one_line_with_position_and_no_file_text():
    with pytest.raises(TopologyError) as err:
        yaml_source.parse("publisher: postgresql://u:s3cret@h/db: x\n", "f.yaml")
    assert (
        str(err.value) == "topology file f.yaml:1:38: invalid YAML: mapping values are not allowed here; "
        "fix the YAML syntax there"
    )


def test_alias_bombs_and_deep_nesting_are_refused():
    bomb = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcde", "bcdef", strict=True)
    )
    with pytest.raises(TopologyError, match="more than 100000 values"):
        yaml_source.parse(bomb, "f.yaml")
    with pytest.raises(TopologyError, match="nest more than 64 levels"):
        yaml_source.parse("a: " + "[" * 70 + "]" * 70 + "\n", "f.yaml")


def test_recursive_alias_is_a_validation_error_not_a_crash():
    message = _error(yaml_source.parse("a: &a [*a]\n", "f.yaml").data | {"publisher": "a"})
    assert "(top level): required key 'distributor' is missing" in message


def test_file_problems(tmp_path):
    def error(path) -> str:
        with pytest.raises(TopologyError) as err:
            yaml_source.read(path)
        return str(err.value)

    assert error(tmp_path / "nope.yaml") == f"topology file {tmp_path}/nope.yaml does not exist: check the path"
    assert error(tmp_path).startswith(f"topology file {tmp_path} is a directory")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"a: 1\nb: caf\xe9\n")
    assert error(bad) == f"topology file {bad}:2: is not UTF-8 text (byte 0xe9 at offset 11); save the file as UTF-8"
    bom = tmp_path / "bom.yaml"
    bom.write_bytes("\ufeffa: é\n".encode())
    assert yaml_source.read(bom).data == {"a": "é"}
    empty = tmp_path / "empty.yaml"
    empty.write_text("  \n")
    assert error(empty).endswith(
        "is empty: write the topology's publisher, distributor, subscribers, publications and subscriptions in it"
    )


@pytest.mark.parametrize(
    "loc, text",
    [
        ((), "(top level)"),
        (("a",), "a"),
        (("a", 0, "b"), "a[0].b"),
        (("s", "Bad-Name"), "s['Bad-Name']"),
    ],
)
def test_format_loc(loc, text):
    assert yaml_source.format_loc(loc) == text


def test_keys_must_be_names_and_names_must_be_strings():
    data = _data(publications=[{"name": "shop", "articles": [{"table": "t", 1: "x"}]}])
    assert "publications[0].articles[0][1]: the key 1 is not a name; known keys here: columns" in _error(data)
    for option in ("name", "destination"):
        assert f"articles[0].{option}: expected a string, got nothing (null); give a value or remove the key" in _error(
            _article(**{option: None})
        )
    assert "articles[0].name: article name is empty" in _error(_article(name=""))


def test_resolution_errors_name_the_server():
    topo = topology.from_dict(_data(subscribers={"s1": "nope_conn"}))
    with pytest.raises(
        TopologyError,
        match=r"^subscribers\.s1: connection id 'nope_conn' cannot be resolved without Airflow: resolve the "
        r"topology with airflow_repl\.hooks\.connections\.resolve_topology",
    ):
        connections.resolve_topology(topo, lambda ref: "host=h" if ref != "nope_conn" else connections.resolve(ref))


def test_the_subscription_key_paused():
    assert topology.from_dict(_data()).subscription("shop", "s1").paused is None  # absent: apply leaves it
    for value in (True, False):
        topo = topology.from_dict(_sub(paused=value))
        sub = topo.subscription("shop", "s1")
        assert sub.paused is value and "paused" not in sub.options()  # a column of its own, not an option
        assert topology.from_dict(topo.to_dict(with_secrets=True)).subscription("shop", "s1").paused is value
    assert "paused" not in topology.from_dict(_data()).to_dict()["subscriptions"][0]
    message = _error(_sub(paused="yes"))
    assert "subscriptions[0].paused" in message and "'yes'" not in message.split(":", 2)[1]
    assert "subscriptions[0].paused" in _error(_sub(paused=1))  # strict: no number for a boolean
