"""Names the engine gives to server-side objects."""

from __future__ import annotations

import hashlib

_MAX_IDENT = 63  # PostgreSQL's NAMEDATALEN - 1, in bytes


def pg_publication(publication: str) -> str:
    """The PostgreSQL publication (pgoutput filter) behind one of our publications."""
    return f"airflow_repl_{publication}"


#: A publication made (and always rolled back) to let PostgreSQL check one article's row filter.
ROW_FILTER_PROBE = "airflow_repl_row_filter_check"


def slot(publication: str, dbname: str) -> str:
    """The logical replication slot the Log Reader Agent reads for a publication.

    Slot names are cluster-wide, so the name carries a hash of the publisher database's name:
    two databases of one cluster may publish under the same publication name."""
    return f"airflow_repl_{publication}_{hashlib.sha1(dbname.encode()).hexdigest()[:8]}"


def _fit(name: str, salt: str) -> str:
    if len(name.encode()) <= _MAX_IDENT:
        return name
    digest = hashlib.sha1(salt.encode()).hexdigest()[:8]
    cut = name.encode()[: _MAX_IDENT - 9].decode(errors="ignore")
    return f"{cut}_{digest}"


def default_procedure(prefix: str, dest_schema: str, dest_table: str, *, disambiguate: bool = False) -> str:
    """``sp_MS<ins|upd|del>_<schema><table>``.

    Names longer than PostgreSQL's 63-byte limit are cut and given an 8-hex-digit hash of the
    destination, so that they stay unique.  When two articles of a publication would get the
    same name (``a.bc`` and ``ab.c``), ``disambiguate`` adds that hash to both.
    """
    base = f"sp_MS{prefix}_{dest_schema}{dest_table}"
    salt = f"{dest_schema}.{dest_table}"
    if disambiguate:
        digest = hashlib.sha1(salt.encode()).hexdigest()[:8]
        return _fit(f"{base}_{digest}", salt + "#")
    return _fit(base, salt)


def queue_origin(subscriber: str) -> str:
    """The replication origin the Queue Reader Agent applies a subscriber's queued transactions
    under at the publisher: the Log Reader records it with each such transaction, and the
    Distribution Agent does not send those transactions back to that subscriber.

    Origins are cluster-wide names of at most 63 bytes: a hash of the subscriber's name."""
    return f"airflow_repl_q_{hashlib.sha1(subscriber.encode()).hexdigest()[:16]}"


#: Prefix of the transactional logical message (``pg_logical_emit_message``) an immediate
#: subscriber's transaction carries at the publisher, naming its origin (:func:`queue_origin`):
#: the transaction is committed by ``COMMIT PREPARED``, whose WAL record PostgreSQL decodes
#: without the committing session's replication origin, so the Log Reader takes it from this.
ORIGIN_MESSAGE = "airflow_repl.origin"

#: Prefix of the transactional logical-decoding message ``airflow-repl schema-change`` emits,
#: in the transaction of the change, for each article of the changed table: what changed and
#: the article's definition after it (JSON).  The Log Reader turns it into a schema-change
#: command at that point of the transaction.
DDL_MESSAGE = "airflow_repl.ddl"
#: Prefix of the transactional logical message a tracer token is (``airflow-repl tracer post``):
#: JSON ``{"token_id", "publication", "posted_at"}``, in a transaction of its own that changes no
#: table, so it travels through the Log Reader and the Distribution Agent in commit order.
TRACER_MESSAGE = "airflow_repl.tracer"


def immediate_gid_prefix(publication: str, subscriber: str) -> str:
    """The start of the global transaction identifier (``PREPARE TRANSACTION``) of every
    immediate-updating transaction of ``subscriber`` under ``publication`` at the publisher; the
    subscriber's local transaction id (xid8, decimal) follows.  Prepared transactions are
    cluster-wide at the publisher: the prefix carries a hash of both names."""
    digest = hashlib.sha1(f"{publication}\0{subscriber}".encode()).hexdigest()[:16]
    return f"airflow_repl_i_{digest}_"
