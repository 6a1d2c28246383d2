"""The provider's conventions, as Airflow and the installed postgres / apache-spark providers
follow them: provider metadata, the connection form, SQL templates, the sensors' configuration."""

from __future__ import annotations

import pytest


def test_the_connection_form_has_a_topology_and_a_default_publication_field():
    """Read by Airflow's own ProvidersManager, as the UI's connection form gets them."""
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    widgets = manager.connection_form_widgets
    fields = {name: w.field_name for name, w in widgets.items() if name.startswith("extra__airflow_repl__")}
    assert set(fields.values()) == {"topology", "publication"}
    assert widgets["extra__airflow_repl__topology"].field["schema"]["title"] == "Topology file"
    behaviour = manager.field_behaviours["airflow_repl"]
    assert {"host", "login", "password", "port", "schema", "extra"} <= set(behaviour["hidden_fields"])
    assert behaviour["placeholders"]["extra__airflow_repl__topology"].endswith(".yaml")


def test_schema_change_sql_is_read_from_a_sql_file_and_rendered(tmp_path):
    from airflow.sdk import DAG

    from airflow_repl.operators.schema import SchemaChangeOperator

    (tmp_path / "add_note.sql").write_text("ALTER TABLE public.orders ADD COLUMN {{ params.column }} text\n")
    with DAG(dag_id="sql_file", schedule=None, template_searchpath=[str(tmp_path)], params={"column": "note"}) as dag:
        op = SchemaChangeOperator(task_id="add", topology="t.yaml", publication="p", sql="add_note.sql")
    assert SchemaChangeOperator.template_fields_renderers == {"sql": "sql"}
    op.render_template_fields({"params": dag.params}, dag.get_template_env())
    assert op.sql.strip() == "ALTER TABLE public.orders ADD COLUMN note text"
    assert op.topology == "t.yaml"  # not a .sql path: left as it is


@pytest.mark.parametrize("module", ["airflow_repl.sensors.wal_retention", "airflow_repl.sensors.quiescing"])
def test_the_sensors_read_the_task_sdks_configuration(module):
    import importlib

    import airflow.sdk

    assert importlib.import_module(module).conf is airflow.sdk.conf


def test_both_triggers_name_their_arguments_alike():
    import inspect

    from airflow_repl.triggers.quiescing import PollTrigger
    from airflow_repl.triggers.wal_retention import WalRetentionTrigger

    shared = {"topology_path", "publication", "poll_interval", "end_time"}
    assert shared <= set(inspect.signature(PollTrigger.__init__).parameters)
    _, kwargs = WalRetentionTrigger(topology_path="/t.yaml", publication="p", end_time=9.0).serialize()
    assert shared <= set(kwargs) and kwargs["end_time"] == 9.0
    # the names serialized before 0.2.0
    _, old = WalRetentionTrigger(topology="/t.yaml", publication="p", deadline=9.0).serialize()
    assert old == kwargs
