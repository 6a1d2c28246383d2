"""The topology model: publishers, distributor, subscribers, publications, articles, row
filters, propagation methods and generated names, exactly as the user's YAML states them.

Owns: reading YAML with positions (``yaml_source``), the strict pydantic model (``topology``),
propagation methods and call syntaxes (``propagation``), row-filter checks (``row_filters``) and
the names the engine generates (``naming``), update modes and conflict policies (``updating``),
and the schema-change statements that can be replicated (``ddl``: parsed with PostgreSQL's own
parser, widening type rules).

May import: :mod:`airflow_repl.engine.errors`, pydantic, PyYAML and pglast.  Never a database driver:
the model is pure data and validation, and resolving a server reference to a connection string
is the PostgreSQL layer's job (``postgres.connections.resolve_topology``).
"""
