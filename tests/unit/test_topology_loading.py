"""Topology loading and validation without a server: the YAML file, static errors naming the
object, call syntaxes allowed per operation, passwords never shown.  (The errors found against a
real publisher are in ``tests/integration/test_topology.py``.)"""

from __future__ import annotations

import pytest

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres import connections


def _topo(**over):
    data = {
        "publisher": "postgresql://u@127.0.0.1:1/p",
        "distributor": "postgresql://u@127.0.0.1:1/d",
        "subscribers": {"s1": "postgresql://u@127.0.0.1:1/s"},
        "publications": [
            {"name": "sales", "articles": ["public.orders", {"table": "crm.customers", "destination": "copy.clients"}]}
        ],
        "subscriptions": [{"publication": "sales", "subscriber": "s1"}],
    }
    data.update(over)
    return data


def test_yaml_file_loads_with_defaults_and_env_expansion(tmp_path, monkeypatch):
    monkeypatch.setenv("SNAPDIR", str(tmp_path / "snaps"))
    path = tmp_path / "t.yaml"
    path.write_text("""
publisher: pub_conn
distributor: postgresql://repl@localhost:5432/distribution
subscribers: {reporting: sub_conn}
snapshot_folder: ${SNAPDIR}
publications:
  - name: shop
    articles:
      - table: public.orders
      - {table: crm.customers, name: clients, destination: reporting.clients, upd_cmd: XCALL}
subscriptions:
  - {publication: shop, subscriber: reporting, commit_batch_size: 7}
""")
    topo = topology.load(path)
    pub = topo.publication("shop")
    assert [a.name for a in pub.articles] == ["orders", "clients"]
    assert pub.article("orders").destination == "public.orders"
    clients = pub.article("clients")
    assert (clients.source, clients.destination) == ("crm.customers", "reporting.clients")
    assert clients.upd_cmd.syntax == "XCALL" and clients.ins_cmd.syntax == "CALL"
    assert pub.article("orders").upd_cmd.syntax == "SCALL"
    assert topo.subscription("shop", "reporting").commit_batch_size == 7
    assert topo.snapshot_folder == str(tmp_path / "snaps")
    assert topo.publisher.ref == "pub_conn"


def test_uri_passwords_never_show(tmp_path):
    topo = topology.from_dict(_topo(publisher="postgresql://repl:s3cret@db.example:5433/shop"))
    assert "s3cret" not in repr(topo) and "s3cret" not in str(topo.to_dict())
    assert topo.to_dict()["publisher"] == "repl@db.example:5433/shop"
    assert "s3cret" in str(topo.to_dict(with_secrets=True))  # only for the job's 0600 spec file


def test_malformed_uri_error_does_not_quote_the_password():
    topo = topology.from_dict(_topo(publisher="postgresql://repl:s%zzecret@db.example:5433/shop"))
    with pytest.raises(TopologyError, match=r"connection URI for db.example is malformed") as err:
        connections.resolve_topology(topo)
    assert "zzecret" not in str(err.value) and "zzecret" not in repr(topo)


def test_unset_variable_in_snapshot_folder_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    path = tmp_path / "t.yaml"
    path.write_text(
        "publisher: a\ndistributor: b\npublications: [{name: p, articles: [t]}]\nsnapshot_folder: ${NOPE_NOT_SET}\n"
    )
    with pytest.raises(TopologyError, match="NOPE_NOT_SET"):
        topology.load(path)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["publications"][0]["articles"].append("public.orders"), "duplicate article"),
        (
            lambda d: d["publications"][0]["articles"].append(
                {"table": "x.orders", "name": "o2", "destination": "public.orders"}
            ),
            "duplicate article destination",
        ),
        (lambda d: d["publications"].append({"name": "sales", "articles": ["a.b"]}), "defined twice"),
        (lambda d: d["publications"][0].update(name="Bad-Name"), "publication name 'Bad-Name' is invalid"),
        (
            lambda d: d["subscriptions"].append({"publication": "nope", "subscriber": "s1"}),
            "unknown publication 'nope'",
        ),
        (lambda d: d["subscriptions"].append({"publication": "sales", "subscriber": "zz"}), "unknown subscriber 'zz'"),
        (
            lambda d: d["publications"][0]["articles"].append({"table": "a.b", "colour": 1}),
            r"publications\[0\]\.articles\[2\]\.colour: unknown key 'colour'",
        ),
        (lambda d: d["publications"][0]["articles"].append({"table": "a.b.c"}), "schema.table"),
        (
            lambda d: d["subscriptions"][0].update(commit_batch_size=0),
            r"subscriptions\[0\]\.commit_batch_size: 0 is out of range: use an integer from 1 to 1000000",
        ),
    ],
)
def test_static_errors_name_the_object(mutate, message):
    data = _topo()
    mutate(data)
    with pytest.raises(TopologyError, match=message):
        topology.from_dict(data)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("ins_cmd", "SCALL", "SCALL is not allowed for inserts; allowed call syntaxes: CALL"),
        ("ins_cmd", "XCALL", "XCALL is not allowed for inserts"),
        ("del_cmd", "MCALL", "MCALL is not allowed for deletes; allowed call syntaxes: CALL, XCALL"),
        ("upd_cmd", "VCALL", "reserved for updatable subscriptions"),
        ("upd_cmd", "FOO", "not understood"),
        ("upd_cmd", "CALL bad;name", "not a valid procedure name"),
    ],
)
def test_call_syntax_not_allowed_is_rejected_with_choices(option, value, message):
    data = _topo()
    data["publications"][0]["articles"][0] = {"table": "public.orders", option: value}
    with pytest.raises(TopologyError, match=message):
        topology.from_dict(data)


def test_custom_sql_and_none_propagation_parse():
    data = _topo()
    data["publications"][0]["articles"][0] = {
        "table": "public.orders",
        "ins_cmd": "SQL",
        "del_cmd": "NONE",
        "upd_cmd": "MCALL audit.upd_orders",
    }
    art = topology.from_dict(data).publication("sales").article("orders")
    assert (art.ins_cmd.method, art.del_cmd.method) == ("sql", "none")
    assert (art.upd_cmd.syntax, art.upd_cmd.procedure) == ("MCALL", "audit.upd_orders")


def test_include_children_must_be_a_boolean():
    data = {
        "publisher": "postgresql://u@h/a",
        "distributor": "postgresql://u@h/b",
        "publications": [{"name": "p", "articles": [{"table": "t", "include_children": True}]}],
    }
    assert topology.from_dict(data).publication("p").articles[0].include_children is True
    data["publications"][0]["articles"][0]["include_children"] = "yes"
    with pytest.raises(TopologyError, match=r"articles\[0\]\.include_children: expected true or false"):
        topology.from_dict(data)
