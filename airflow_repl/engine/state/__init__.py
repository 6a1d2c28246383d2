"""Where the agents keep their state: the distribution database, and the small
``airflow_repl`` schema at each subscriber (the watermark of the last applied transaction and
the ledger of loaded snapshot files).

Owns: ``distdb`` (the distribution database's schema and every statement on its tables but
those of ``progress`` and ``retention``), ``subscriber_state`` (the subscriber's ``airflow_repl``
schema and every statement on it, the queue of queued updating among them),
``subscriber_queue`` (the questions ``set-update-mode`` asks about a queued subscriber's queue),
``publisher_state`` (the Queue Reader's ``queue_applied`` and replication origin at the
publisher), ``subscriber_immediate`` (an immediate subscriber's publisher link and
prepared-transaction record), ``progress`` (the statements on the tracer tokens' tables, whose
DDL is distdb's, and how far each subscription is behind a position, its status at a glance,
its backlog, and the recent runs and errors the report shows) and ``retention`` (what the
cleanup agent may delete, and expiring subscriptions); one function per question an agent asks.

May import: ``errors``, ``model``, ``postgres`` and ``articles``.
"""
