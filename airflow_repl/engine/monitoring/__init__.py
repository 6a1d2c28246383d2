"""Watching replication: what the status, the report, the sensors and the health check read.

Owns: ``status`` (each subscription's backlog, watermark, last runs, last error, lag and expiry,
and which run counts as failed: ``airflow-repl status``), ``health`` (each subscription against
its monitoring thresholds: ``status --check``), ``report`` (the data of ``airflow-repl report``;
:mod:`airflow_repl.presentation` draws it, and the status table, outside the engine),
``tracer`` (posting tracer tokens, their latency history), ``quiescing`` (the checks of the
quiescing sensors: a token arrived, a topology quiesced up to a position) and ``wal_retention``
(the WAL a publication's slot retains against its limit; the Log Reader warns).

May import: ``errors``, ``model``, ``mariadb``, ``postgres``, ``articles``, ``codegen``, ``state``,
``subscriber``, ``provisioning`` and ``runtime``.
"""
