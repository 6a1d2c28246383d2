"""Where the agents keep their state: the distribution database, and the small
``airflow_repl`` schema at each subscriber (the watermark of the last applied transaction and
the ledger of loaded snapshot files).

Owns: the distribution database, by entity: ``dist_schema`` (its schema as versioned
migrations, recorded in ``airflow_repl.schema_version``, and whether it is deployed),
``dist_publications`` (publications, their articles and updating options, custom scripts,
snapshots), ``dist_subscriptions`` (subscriptions: options, update mode, status, delivery),
``dist_subscription_articles`` (the articles each subscription holds, each copied on its own
with its hand-off, and the limits they put on a batch's delivery),
``dist_transactions`` (the replicated transactions and commands: the Log Reader's writes, the
Distribution Agent's reads), ``dist_history`` (agent runs and their errors), ``dist_conflicts``
(the conflicts of queued updating), ``dist_drops`` (drops under way, and each drop's last step
at the distributor) and ``dist_encoding`` (their JSON, written and read);
``mariadb_subscriber_state`` (a MariaDB subscriber's watermark and snapshot ledger, in InnoDB
tables of its database); ``subscriber_state`` (the subscriber's ``airflow_repl`` schema and every statement on it, the
queue of queued updating among them) and ``subscriber_queue`` (the queue's counts) and
``publisher_state`` (the Queue Reader's ``queue_applied`` and replication origin at the
publisher) and ``subscriber_immediate`` (an immediate subscriber's publisher link and
prepared-transaction record), ``progress`` (the statements on the tracer tokens' tables, whose
DDL is ``dist_schema``'s, and how far each subscription is behind a position, its status at a
glance, its backlog, and the recent runs and errors the report shows) and ``retention`` (what
the cleanup agent may delete, and expiring subscriptions); one function per question an agent
asks.

May import: ``errors``, ``model``, ``mariadb``, ``postgres`` and ``articles``.
"""
