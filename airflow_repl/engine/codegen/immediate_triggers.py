"""Immediate updating (``sync tran``, ``failover``): the SQL installed at an immediate subscriber.

An application's plain INSERT/UPDATE/DELETE on an article table at the subscriber is applied at
the publisher in the same distributed transaction, with PostgreSQL's two-phase commit, through
``dblink`` (shipped with the server):

- the BEFORE row trigger :data:`ROW_TRIGGER` (:func:`capture_function`) sends the change to the
  publisher on a named dblink connection of the session (opened once, kept), inside a remote
  transaction begun with the subscriber's first change of a local transaction
  (``immediate_begin``).  An UPDATE or DELETE there carries the row version the subscriber
  had (``msrepl_tran_version``): when the publisher's row has another version, or no longer
  exists, the remote transaction is made to fail and the subscriber's statement raises an error
  naming the table and the key (SQLSTATE 40001): both sides reject.  The publisher's BEFORE
  UPDATE row-version trigger gives the new version, and the subscriber's row takes it.  Each key
  the change touched (old and new) is recorded in ``airflow_repl.queue_taken`` with the publisher
  transaction's id, in the local transaction: the Distribution Agent leaves the publisher's
  older commands of that key out (:mod:`~airflow_repl.engine.subscriber.superseded`);
- the constraint trigger :data:`COMMIT_TRIGGER`, DEFERRABLE INITIALLY DEFERRED, fires at the
  subscriber's commit (:func:`prepare_function`): ``PREPARE TRANSACTION '<gid>'`` at the
  publisher, and the gid recorded in ``airflow_repl.immediate_gids`` in the local transaction;
  then ``NOTIFY`` :data:`CHANNEL`, delivered when the local transaction commits.  The remote
  transaction also carries a transactional logical message
  (:data:`~airflow_repl.engine.model.naming.ORIGIN_MESSAGE`) naming the subscriber's origin: the
  Log Reader records it, and the Distribution Agent does not send the change back to its origin.  The gid is
  :func:`~airflow_repl.engine.model.naming.immediate_gid_prefix` + the local transaction id;
- after the local commit nothing more can run in PostgreSQL: the resolver
  (:mod:`~airflow_repl.engine.subscriber.in_doubt`) commits the prepared transaction at the
  publisher (or rolls it back when the local transaction did not commit); the session's next
  transaction commits it too (``immediate_begin``), so a session's consecutive transactions
  never wait for their own predecessor's locks.

Both triggers are ordinary: they do not fire under ``session_replication_role = replica``, the
role of every replicated write at the subscriber.  The row trigger's name sorts after the
row-version trigger's, so it runs after it and sets the version last.

The functions are SECURITY DEFINER: the application's roles need no right on the stored
publisher connection string (:mod:`~airflow_repl.engine.state.subscriber_immediate`, readable
by its owner only).
"""

from __future__ import annotations

from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.updating import ROW_VERSION_COLUMN
from airflow_repl.engine.postgres import pgoutput, trigger_switching
from airflow_repl.engine.postgres.quoting import dollar_quote, ident, qualified

#: The BEFORE row trigger sending each change to the publisher (sorts after airflow_repl_tran_version).
ROW_TRIGGER = "airflow_repl_two_phase"
#: The deferred constraint trigger preparing the publisher's transaction at the subscriber's commit.
COMMIT_TRIGGER = "airflow_repl_two_phase_commit"
#: NOTIFY channel: a subscriber transaction prepared at the publisher has committed (payload: publication).
CHANNEL = "airflow_repl_immediate"
#: A remote transaction left idle this long (a local transaction that rolled back, an idle
#: session) is ended by the publisher, so its locks are never held for long; a local
#: transaction idle longer between two changes then fails at commit, at both sides.
REMOTE_IDLE_TIMEOUT = "30s"


#: Counts the changes a remote transaction received (checked before its PREPARE).
_SENT = (
    "pg_catalog.set_config('airflow_repl.sent', (coalesce(nullif(pg_catalog.current_setting('airflow_repl.sent', "
    "true), ''), '0')::int + 1)::text, true)"
)

_BEGIN_BODY = """
DECLARE
    h      text := pg_catalog.substr(pg_catalog.md5(p), 1, 16);
    conn   text := 'airflow_repl_imm_' || h;
    guc    text := 'airflow_repl.imm_' || h;
    xid    text := pg_catalog.pg_current_xact_id()::text;
    state  text := pg_catalog.current_setting(guc, true);
    target text;
BEGIN
    IF state = xid || '/open' THEN
        RETURN conn;
    ELSIF state LIKE xid || '/prepared/%' THEN
        RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state', MESSAGE = 'immediate updating of '
            || 'publication ' || p || ': a row changed after this transaction was prepared at the publisher (SET '
            || 'CONSTRAINTS ... IMMEDIATE, or a deferred trigger): it is rolled back at both sides';
    END IF;
    IF conn = ANY (coalesce(@DBLINK@.dblink_get_connections(), '{}')) THEN
        IF state LIKE '%/prepared/%' THEN
            -- this session's previous transaction committed (the setting would have been rolled
            -- back with it otherwise): commit its prepared one at the publisher (unless the
            -- resolver did it already)
            BEGIN
                PERFORM @DBLINK@.dblink_exec(conn, pg_catalog.format('COMMIT PREPARED %L',
                    pg_catalog.split_part(state, '/', 3)));
            EXCEPTION WHEN OTHERS THEN
                NULL;
            END;
        END IF;
        BEGIN  -- a remote transaction of an earlier local one that rolled back, if any, ends here
            PERFORM @DBLINK@.dblink_exec(conn, 'ROLLBACK; BEGIN');
            PERFORM pg_catalog.set_config(guc, xid || '/open', false);
            RETURN conn;
        EXCEPTION WHEN OTHERS THEN  -- the connection was lost: open it again
            PERFORM @DBLINK@.dblink_disconnect(conn);
        END;
    END IF;
    SELECT i.conninfo INTO target FROM airflow_repl.immediate_publisher i WHERE i.publication = p;
    IF target IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state', MESSAGE = 'immediate updating of '
            || 'publication ' || p || ' is not set up at this subscriber: run the Snapshot Agent for it';
    END IF;
    PERFORM @DBLINK@.dblink_connect(conn, target);
    PERFORM @DBLINK@.dblink_exec(conn, 'SET client_min_messages = error; '
        || 'SET idle_in_transaction_session_timeout = ''@IDLE@''; BEGIN');
    PERFORM pg_catalog.set_config(guc, xid || '/open', false);
    RETURN conn;
END;
"""

_CAPTURE_BODY = """
DECLARE
    conn text := airflow_repl.immediate_begin(TG_ARGV[0]);
    cguc text := 'airflow_repl.immc_' || pg_catalog.substr(pg_catalog.md5(TG_ARGV[0]), 1, 16);
    r    record;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT * INTO r FROM @DBLINK@.dblink(conn, pg_catalog.format(TG_ARGV[2], pg_catalog.to_jsonb(NEW)::text))
            AS x(sent text, xid text);
    ELSE
        SELECT * INTO r FROM @DBLINK@.dblink(conn, pg_catalog.format(
            CASE TG_OP WHEN 'UPDATE' THEN TG_ARGV[3] ELSE TG_ARGV[4] END,
            pg_catalog.to_jsonb(OLD)::text, pg_catalog.to_jsonb(NEW)::text))
            AS x(done text, here text, sent text, xid text);
        IF r.done IS NULL THEN
            PERFORM airflow_repl.immediate_reject(conn, TG_ARGV[1], TG_ARGV[5]::text[], pg_catalog.to_jsonb(OLD), r.here);
        END IF;
        IF TG_OP = 'UPDATE' THEN
            NEW.@VERSION@ := r.done::uuid;
        END IF;
    END IF;
    -- the keys the publisher's transaction took as they are here: the Distribution Agent does not
    -- apply the publisher's older commands of these keys (they are in this row already)
    INSERT INTO airflow_repl.queue_taken (publication, article, key, publisher_xid, via)
    SELECT DISTINCT TG_ARGV[0], TG_ARGV[6], k.key, r.xid::bigint, 'immediate'
    FROM (SELECT (SELECT pg_catalog.jsonb_object_agg(c, i.img -> c) FROM pg_catalog.unnest(TG_ARGV[5]::text[]) c)
          FROM (VALUES (CASE WHEN TG_OP <> 'INSERT' THEN pg_catalog.to_jsonb(OLD) END),
                       (CASE WHEN TG_OP <> 'DELETE' THEN pg_catalog.to_jsonb(NEW) END)) AS i(img)
          WHERE i.img IS NOT NULL) AS k(key);
    PERFORM pg_catalog.set_config(cguc, (coalesce(nullif(pg_catalog.current_setting(cguc, true), ''), '0')::int
        + 1)::text, true);
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
"""

_REJECT_BODY = """
DECLARE
    msg text := 'immediate updating: the row of table ' || label || ' with key '
        || (SELECT pg_catalog.jsonb_object_agg(k, old_row -> k) FROM pg_catalog.unnest(keys) k)::text
        || CASE WHEN here IS NULL THEN ' does not exist at the publisher'
           ELSE ' changed at the publisher since the subscriber got it (row version ' || here || ' there, '
                || coalesce(old_row ->> '@VERSION@', 'none') || ' here)' END
        || ': the change is rejected at the publisher and at the subscriber';
BEGIN
    -- the remote transaction fails too (its locks are released now; its PREPARE will fail)
    PERFORM @DBLINK@.dblink_exec(conn, pg_catalog.format('DO %L', pg_catalog.format(
        'BEGIN RAISE EXCEPTION USING ERRCODE = ''40001'', MESSAGE = %L; END', msg)), false);
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure', MESSAGE = msg;
END;
"""

_CHECK_SENT = (
    "BEGIN IF coalesce(pg_catalog.current_setting('airflow_repl.sent', true), '') IS DISTINCT FROM %L THEN "
    "RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'immediate updating: the subscriber transaction rolled back "
    "a savepoint after changes the publisher applied: the transaction is rolled back at both sides'; END IF; END"
)

_PREPARE_BODY = """
DECLARE
    p     text := TG_ARGV[0];
    h     text := pg_catalog.substr(pg_catalog.md5(p), 1, 16);
    conn  text := 'airflow_repl_imm_' || h;
    guc   text := 'airflow_repl.imm_' || h;
    xid   text := pg_catalog.pg_current_xact_id()::text;
    state text := pg_catalog.current_setting(guc, true);
    sent  text := coalesce(nullif(pg_catalog.current_setting('airflow_repl.immc_' || h, true), ''), '0');
    gid   text;
    mark  text;
BEGIN
    IF state LIKE xid || '/prepared/%' THEN
        RETURN NULL;
    ELSIF state IS DISTINCT FROM xid || '/open' THEN
        RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state', MESSAGE = 'immediate updating of '
            || 'publication ' || p || ': this transaction changed rows without a transaction at the publisher';
    END IF;
    SELECT i.gid_prefix || xid, i.origin INTO gid, mark FROM airflow_repl.immediate_publisher i
        WHERE i.publication = p;
    PERFORM @DBLINK@.dblink_exec(conn, pg_catalog.format('DO %L; SELECT pg_catalog.pg_logical_emit_message(true, '
        || '%L, %L); PREPARE TRANSACTION %L', pg_catalog.format(@CHECK@, sent), '@MESSAGE@', mark, gid));
    INSERT INTO airflow_repl.immediate_gids (gid, publication, xid) VALUES (gid, p, xid::xid8);
    PERFORM pg_catalog.set_config(guc, xid || '/prepared/' || gid, false);
    PERFORM pg_catalog.pg_notify('@CHANNEL@', p);
    RETURN NULL;
END;
"""


def _body(template: str, dblink_schema: str) -> str:
    return (
        template.replace("@DBLINK@", ident(dblink_schema))
        .replace("@IDLE@", REMOTE_IDLE_TIMEOUT)
        .replace("@VERSION@", ROW_VERSION_COLUMN)
        .replace("@CHANNEL@", CHANNEL)
        .replace("@MESSAGE@", naming.ORIGIN_MESSAGE)
        .replace("@CHECK@", "'" + _CHECK_SENT.replace("'", "''") + "'")
    )


_DEFINER = "LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS"


def functions_script(dblink_schema: str) -> str:
    """The four functions in schema ``airflow_repl`` (``dblink``'s functions are in ``dblink_schema``)."""
    return (
        f"CREATE OR REPLACE FUNCTION airflow_repl.immediate_begin(p text) RETURNS text {_DEFINER} "
        f"{dollar_quote(_body(_BEGIN_BODY, dblink_schema))};\n"
        f"CREATE OR REPLACE FUNCTION airflow_repl.immediate_reject(conn text, label text, keys text[], old_row jsonb, "
        f"here text) RETURNS void {_DEFINER} {dollar_quote(_body(_REJECT_BODY, dblink_schema))};\n"
        f"CREATE OR REPLACE FUNCTION airflow_repl.immediate_capture() RETURNS trigger {_DEFINER} "
        f"{dollar_quote(_body(_CAPTURE_BODY, dblink_schema))};\n"
        f"CREATE OR REPLACE FUNCTION airflow_repl.immediate_prepare() RETURNS trigger {_DEFINER} "
        f"{dollar_quote(_body(_PREPARE_BODY, dblink_schema))};\n"
        "REVOKE ALL ON FUNCTION airflow_repl.immediate_begin(text), "
        "airflow_repl.immediate_reject(text, text, text[], jsonb, text) FROM PUBLIC;\n"
    )


def _fmt(text: str) -> str:
    """Text inside a ``format()`` template: its ``%`` doubled."""
    return text.replace("%", "%%")


def remote_statements(article: ResolvedArticle) -> tuple[str, str, str]:
    """The ``format()`` templates of the INSERT (``%1$L`` = new row as JSON), UPDATE and DELETE
    (``%1$L`` old row, ``%2$L`` new row) run at the publisher.  Each returns one row, ending with
    the running count of changes and the publisher transaction's id (as the Log Reader records
    it); UPDATE and DELETE start with the new version or count, NULL when no row had the old
    version, and the publisher row's current version."""
    key = article.primary_key
    if not key:
        raise TopologyError(
            f"article {article.name!r} of publication {article.publication!r}: immediate updating needs a primary "
            f"key on {article.table.qualified} to find a subscriber's row at the publisher"
        )
    table = _fmt(qualified(article.table.schema, article.table.name))
    columns = list(article.column_names)
    if ROW_VERSION_COLUMN not in columns:
        columns.append(ROW_VERSION_COLUMN)
    listed = _fmt(", ".join(ident(c) for c in columns))
    rec = f"pg_catalog.jsonb_populate_record(NULL::{table}, %1$L::jsonb)"
    match = _fmt(" AND ".join(f"t.{ident(k)} = o.{ident(k)}" for k in key))
    version = _fmt(ident(ROW_VERSION_COLUMN))
    old = f"o AS (SELECT * FROM {rec})"
    here = f"(SELECT t.{version}::text FROM {table} t, o WHERE {match})"
    sent = f"{_fmt(_SENT)}, {_fmt(pgoutput.CURRENT_XID_SQL)}::text"
    insert = f"WITH i AS (INSERT INTO {table} ({listed}) SELECT {listed} FROM {rec}) SELECT {sent}"
    sets = _fmt(", ".join(f"{ident(c)} = n.{ident(c)}" for c in columns if c != ROW_VERSION_COLUMN))
    # the row is locked by key first, in its own statement: a change of it still uncommitted
    # (another subscriber session's, prepared) is waited for, and the next statement's snapshot
    # sees its outcome; the version check alone would miss the row (not visible yet)
    # (dblink wants every result of the string in the final result's shape: four text columns)
    lock = f"WITH {old} SELECT NULL::text, NULL::text, NULL::text, NULL::text FROM {table} t, o WHERE {match} FOR UPDATE OF t; "
    update = lock + (
        f"WITH {old}, n AS (SELECT * FROM pg_catalog.jsonb_populate_record(NULL::{table}, %2$L::jsonb)), "
        f"u AS (UPDATE {table} t SET {sets} FROM o, n WHERE {match} AND t.{version} = o.{version} "
        f"RETURNING t.{version}) SELECT (SELECT u.{version}::text FROM u), {here}, {sent}"
    )
    delete = lock + (
        f"WITH {old}, d AS (DELETE FROM {table} t USING o WHERE {match} AND t.{version} = o.{version} "
        f"RETURNING 1) SELECT (SELECT count(*)::text FROM d HAVING count(*) > 0), "
        f"{here}, {sent}"
    )
    return insert, update, delete


def _table(article: ResolvedArticle) -> sql.Identifier:
    return sql.Identifier(article.dest_schema, article.dest_table)


def install(article: ResolvedArticle, *, enabled: bool = True) -> sql.Composed:
    """Create (or re-create) the article's two triggers at the subscriber; ``enabled=False``
    leaves them disabled (a failover subscription in queued updating now)."""
    insert, update, delete = remote_statements(article)
    label = qualified(article.table.schema, article.table.name)
    keys = "{" + ",".join('"' + k.replace("\\", "\\\\").replace('"', '\\"') + '"' for k in article.primary_key) + "}"
    args = sql.SQL(", ").join(
        sql.Literal(a) for a in (article.publication, label, insert, update, delete, keys, article.name)
    )
    parts = [
        "DROP TRIGGER IF EXISTS {row} ON {table}; DROP TRIGGER IF EXISTS {commit} ON {table}; ",
        "CREATE TRIGGER {row} BEFORE INSERT OR UPDATE OR DELETE ON {table} FOR EACH ROW "
        "EXECUTE FUNCTION airflow_repl.immediate_capture({args}); ",
        "CREATE CONSTRAINT TRIGGER {commit} AFTER INSERT OR UPDATE OR DELETE ON {table} "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION airflow_repl.immediate_prepare({pub})",
    ]
    statement = sql.SQL("".join(parts)).format(
        row=sql.Identifier(ROW_TRIGGER),
        commit=sql.Identifier(COMMIT_TRIGGER),
        table=_table(article),
        args=args,
        pub=sql.Literal(article.publication),
    )
    if enabled:
        return statement
    off = trigger_switching.switch_triggers(
        article.dest_schema, article.dest_table, [ROW_TRIGGER, COMMIT_TRIGGER], enabled=False
    )
    return sql.Composed([statement, sql.SQL("; "), off])


def drop(article: ResolvedArticle) -> sql.Composed:
    """Drop the article's two triggers (a subscription that is no longer immediate)."""
    return sql.SQL("DROP TRIGGER IF EXISTS {row} ON {table}; DROP TRIGGER IF EXISTS {commit} ON {table}").format(
        row=sql.Identifier(ROW_TRIGGER), commit=sql.Identifier(COMMIT_TRIGGER), table=_table(article)
    )
