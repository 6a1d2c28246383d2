"""MariaDB access: everything that knows how to talk to a MariaDB (or MySQL) subscriber.

Owns: the ``mariadb://`` connection strings, the driver's settings from a URI or an Airflow
``mysql`` connection's extras, and connections with their session settings (``connections``),
identifier quoting (``quoting``), the map from PostgreSQL column types to MariaDB column types
and from PostgreSQL text values to MariaDB parameters (``types``), and the subscriber
catalog's checks: storage engine, primary key, column types and key collations (``catalog``).

May import: :mod:`airflow_repl.engine.errors`, :mod:`airflow_repl.engine.model` and PyMySQL.
Nothing here knows about articles, agents or the distribution database.
"""
