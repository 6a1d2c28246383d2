"""Every advisory lock the product takes, one function each, named by what it keeps apart.

A lock's key is ``hashtext('airflow_repl.<what>')``, computed by the server from text passed as a
parameter (a publication's name is never part of the statement).  Two kinds:

* session locks, tried and never waited for here: held until released or until the connection
  ends (also when its process dies).  :func:`try_agent_lock` (one run of an agent per
  publication, or per publication and subscriber: ``airflow_repl.<agent>.<publication>``) and
  :func:`try_writer_turn` / :func:`release_writer_turn` (one writer at a time at a queued
  subscriber: ``airflow_repl.subscriber_writer.<publication>``).  Each commits, so that the lock
  outlives no transaction of the caller's and holds none open.
* transaction locks, waited for and released at the caller's commit or rollback: they make the
  ``CREATE ... IF NOT EXISTS`` of two sessions creating the same tables at once take turns.
  :func:`lock_distribution_schema` (``airflow_repl.ddl``, the distribution database's tables),
  :func:`lock_subscriber_schema` (``airflow_repl.subscriber_ddl``, a subscriber's queue and
  immediate-updating tables), :func:`lock_publisher_schema` (``airflow_repl.publisher_ddl``) and
  :func:`lock_origin_creation` (``airflow_repl.origin_create``, a replication origin created
  where it is missing).

One more is taken inside the server: the queue's commit trigger at a queued subscriber takes
``airflow_repl.queue_commit`` for the rest of its transaction, so that commit numbers follow the
commit order (:data:`airflow_repl.engine.state.subscriber_state.QUEUE_DDL`).
"""

from __future__ import annotations

from typing import Any

import psycopg


def _try_session_lock(conn: psycopg.Connection[Any], key: str) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)).fetchone()
    conn.commit()
    return bool(row is not None and row[0])


def _lock_for_transaction(conn: psycopg.Connection[Any], key: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))


def _writer_key(publication: str) -> str:
    return f"airflow_repl.subscriber_writer.{publication}"


def agent_lock_key(agent: str, publication: str) -> str:
    """The key of ``agent``'s session lock for ``publication`` (``airflow-repl drop`` takes the
    agents' own locks, and tests hold them)."""
    return f"airflow_repl.{agent}.{publication}"


def try_agent_lock(conn: psycopg.Connection[Any], agent: str, publication: str) -> bool:
    """Take ``agent``'s session lock for ``publication`` on ``conn`` (True), unless another
    session holds it (False)."""
    return _try_session_lock(conn, agent_lock_key(agent, publication))


def try_writer_turn(conn: psycopg.Connection[Any], publication: str) -> bool:
    """Take the writer's turn at a queued subscriber of ``publication`` (True), unless another
    agent has it (False)."""
    return _try_session_lock(conn, _writer_key(publication))


def release_writer_turn(conn: psycopg.Connection[Any], publication: str) -> None:
    """Give back the writer's turn taken by :func:`try_writer_turn` (with no transaction open)."""
    conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (_writer_key(publication),))
    conn.commit()


def lock_distribution_schema(conn: psycopg.Connection[Any]) -> None:
    """Wait for the distribution database's schema, until this transaction ends."""
    _lock_for_transaction(conn, "airflow_repl.ddl")


def lock_subscriber_schema(conn: psycopg.Connection[Any]) -> None:
    """Wait for a subscriber's ``airflow_repl`` schema, until this transaction ends."""
    _lock_for_transaction(conn, "airflow_repl.subscriber_ddl")


def lock_publisher_schema(conn: psycopg.Connection[Any]) -> None:
    """Wait for the publisher's ``airflow_repl`` schema, until this transaction ends."""
    _lock_for_transaction(conn, "airflow_repl.publisher_ddl")


def lock_origin_creation(conn: psycopg.Connection[Any]) -> None:
    """Wait for the creation of replication origins at this server, until this transaction ends."""
    _lock_for_transaction(conn, "airflow_repl.origin_create")
