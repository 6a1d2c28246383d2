"""What the ``airflow-repl`` command shows a person: the engine's data drawn as text and HTML.

Owns: ``status_rows`` (one subscription's status row, its cells and their states: which run
failed, which subscription is not active; both outputs draw it), ``status_table`` (the text
table of ``airflow-repl status``, laid out by ``tabulate``), ``status_prometheus`` (``airflow-repl status -o prometheus``: the Prometheus
text exposition format, written by ``prometheus_client``) and ``report_html`` (the
self-contained HTML page of ``airflow-repl report``, made by the Jinja2 templates in
``templates/``, ``report.html.j2`` and its tables and charts in ``parts.html.j2``).

May import: the engine (its data and rules, such as
:func:`~airflow_repl.engine.monitoring.status.run_failed`), Jinja2, tabulate and prometheus_client.  Never a database
driver, Airflow or PySpark: it draws data it is given (``report_html.write`` has the engine read
it).  The engine never imports this package.
"""
