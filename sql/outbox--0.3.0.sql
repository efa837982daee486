-- outbox 0.2.0: the outbox tables, enqueue and claim.
--
-- Physical layout, chosen for the relay's throughput:
--   event_log     append-only: one INSERT per event.  The relay reads it by
--                 transaction snapshot (column tx), the way PgQ does, so the
--                 happy path needs no per-event UPDATE.
--   relay_cursor  one row: how far the relay has got, as snapshots.
--   event_state   sparse: a row only for an event whose delivery failed,
--                 is waiting for a retry, or is dead.
--   events        the view users read: one row per event with its status,
--                 derived from the three above.
--
-- This script runs as a superuser, and some of its functions run with the
-- owner's rights: every function, operator and type in a default, a view
-- or a function body is qualified (pg_catalog.now(), OPERATOR(pg_catalog.=),
-- ::pg_catalog.regclass), so none resolves to an object a non-superuser
-- made.  Keep it so; outbox--0.1.0--0.2.0.sql must give the same schema
-- (sql/upgrade.sql compares the two).

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

-- CREATE EXTENSION adopts an existing schema named outbox (the control file
-- names it).  Whatever a non-superuser put there beforehand takes part in
-- name resolution here and in every function that runs with the owner's
-- rights: a database owner's outbox.nextval(text) was once bound to the id
-- default and ran as superuser at the first enqueue.  Refuse a schema a
-- non-superuser owns, may create objects in, or has filled: every object
-- in a schema depends on it in pg_depend, so one query finds them all.
-- The same block guards the upgrade, where outbox's own objects are there.
DO LANGUAGE plpgsql $guard$
DECLARE
    nsp      pg_catalog.oid;
    owner    pg_catalog.name;
    super    pg_catalog.bool;
    ext      pg_catalog.oid;
    creators pg_catalog.text;
    strays   pg_catalog.text;
BEGIN
    SELECT n.oid, r.rolname, r.rolsuper INTO nsp, owner, super
      FROM pg_catalog.pg_namespace n
      JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'outbox';
    SELECT e.oid INTO ext FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'outbox';

    -- Grantees of CREATE that are not superusers; grantee 0 is PUBLIC.
    SELECT pg_catalog.string_agg(COALESCE(pg_catalog.quote_ident(r.rolname), 'PUBLIC'), ', ')
      INTO creators
      FROM pg_catalog.pg_namespace n,
           pg_catalog.aclexplode(n.nspacl) a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
     WHERE n.oid OPERATOR(pg_catalog.=) nsp
       AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
       AND NOT COALESCE(r.rolsuper, false);

    -- Objects in the schema that are not outbox's own (nor outbox itself).
    SELECT pg_catalog.string_agg(pg_catalog.concat_ws(' ', o.type, o.identity), ', '
                                 ORDER BY o.type, o.identity)
      INTO strays
      FROM pg_catalog.pg_depend d,
           pg_catalog.pg_identify_object(d.classid, d.objid, d.objsubid) o
     WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
       AND d.refobjid OPERATOR(pg_catalog.=) nsp
       AND NOT (d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                AND d.objid OPERATOR(pg_catalog.=) ext)
       AND NOT EXISTS (
           SELECT FROM pg_catalog.pg_depend m
            WHERE m.classid OPERATOR(pg_catalog.=) d.classid
              AND m.objid OPERATOR(pg_catalog.=) d.objid
              AND m.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
              AND m.refobjid OPERATOR(pg_catalog.=) ext
              AND m.deptype OPERATOR(pg_catalog.=) 'e');

    IF super AND creators IS NULL AND strays IS NULL THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'schema "outbox" cannot be trusted'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = pg_catalog.concat_ws(' ',
                  CASE WHEN NOT super THEN pg_catalog.format(
                      'It is owned by role %I, which is not a superuser.', owner) END,
                  CASE WHEN creators IS NOT NULL THEN pg_catalog.format(
                      'Roles that are not superusers may create objects in it: %s.', creators) END,
                  CASE WHEN strays IS NOT NULL THEN pg_catalog.format(
                      'It holds objects that are not part of extension outbox: %s.', strays) END),
              HINT = 'Check what the schema holds and who made it.  Drop what outbox did not '
                     'create (or the whole schema, if outbox is not installed), make a superuser '
                     'its owner, revoke CREATE on it from other roles, and run the command again.';
END
$guard$;

CREATE SEQUENCE outbox.event_id_seq;

-- The server's current incarnation (src/incarnation.c): drawn anew at
-- every start of the server, stored with each event, and named in
-- its outbox_source header, so that no two events share an identity
-- across a failover, a restore or a split brain.
CREATE FUNCTION outbox._incarnation() RETURNS bigint
LANGUAGE C VOLATILE PARALLEL RESTRICTED
AS 'MODULE_PATHNAME', 'outbox_incarnation';
REVOKE ALL ON FUNCTION outbox._incarnation() FROM PUBLIC;

CREATE TABLE outbox.event_log (
    id          bigint      NOT NULL
                            DEFAULT pg_catalog.nextval('outbox.event_id_seq'::pg_catalog.regclass),
    tx          xid8        NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    biz_type    text        NOT NULL,
    biz_key     text        NOT NULL,
    topic       text        NOT NULL,
    msg_key     text        NOT NULL,
    payload     jsonb,
    headers     jsonb,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- The payload enqueue_bytes took, sent byte for byte (the JSON one is
    -- NULL then).  Last, where 0.3.0's upgrade adds it.
    payload_bytes bytea,
    -- The incarnation the event was enqueued in (0: before 0.3.0).
    incarnation bigint      NOT NULL DEFAULT outbox._incarnation(),
    CONSTRAINT event_log_pkey PRIMARY KEY (id),
    CONSTRAINT event_log_biz_key UNIQUE (biz_type, biz_key),
    CONSTRAINT event_log_one_payload
        CHECK ((payload IS NULL) OPERATOR(pg_catalog.<>) (payload_bytes IS NULL))
);
ALTER SEQUENCE outbox.event_id_seq OWNED BY outbox.event_log.id;

-- The relay reads "committed since the last snapshot" by tx, in (tx, id)
-- order: a window is read as an ordered range of this index.
CREATE INDEX event_log_tx_id ON outbox.event_log (tx, id);

COMMENT ON TABLE outbox.event_log IS
    'Enqueued events, append-only; written by outbox.enqueue(). Read outbox.events instead.';
COMMENT ON COLUMN outbox.event_log.tx IS
    'Top-level transaction id of the enqueuing transaction: the relay reads by snapshot.';

CREATE TABLE outbox.event_state (
    id              bigint      NOT NULL,
    status          text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_error      text,
    updated_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT event_state_pkey PRIMARY KEY (id),
    CONSTRAINT event_state_status
        CHECK (status IN ('new', 'sending', 'sent', 'dead')),
    CONSTRAINT event_state_attempts CHECK (attempts >= 0)
);

-- Events waiting for a retry or in flight one by one, in id order; also
-- the keys they hold back.
CREATE INDEX event_state_unsent ON outbox.event_state (id)
    WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['new', 'sending']);

COMMENT ON TABLE outbox.event_state IS
    'Delivery state of events that needed more than one try; absent means no failure so far.';

-- The relay works in windows: every event whose transaction is visible in
-- done_snapshot has been relayed; the open window covers the events visible
-- in window_snapshot but not in done_snapshot, and of those it has relayed
-- the ones up to (window_last_tx, window_last_id) (it sends a window in
-- (tx, id) order).  source names this database's events to consumers
-- (every message's outbox_source header): kept across restarts, failover
-- and pg_upgrade, new after a restore or in a copy of the cluster.  In
-- exactly_once, sender is part of the relay's
-- transactional.id, chosen by the relay running at sender_place on WAL
-- timeline sender_timeline (a copy of the cluster elsewhere takes another,
-- a promoted standby keeps it), and proof is the token its progress
-- records carry: only a record with it, or with proof_seen (that of its
-- latest record found at a start), is taken (src/sender.c).
CREATE TABLE outbox.relay_cursor (
    singleton       boolean     NOT NULL DEFAULT true,
    done_snapshot   pg_snapshot NOT NULL,
    window_snapshot pg_snapshot,
    window_last_id  bigint      NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    window_last_tx  xid8        NOT NULL DEFAULT '0',
    source          uuid        NOT NULL DEFAULT pg_catalog.gen_random_uuid(),
    sender          bigint      NOT NULL DEFAULT 0,
    sender_place    text,
    sender_timeline integer,
    sender_system   text,
    proof           text,
    proof_seen      text,
    CONSTRAINT relay_cursor_pkey PRIMARY KEY (singleton),
    CONSTRAINT relay_cursor_singleton CHECK (singleton)
);
INSERT INTO outbox.relay_cursor (done_snapshot) VALUES (pg_catalog.pg_current_snapshot());

COMMENT ON TABLE outbox.relay_cursor IS
    'Relay progress as transaction snapshots; written by the relay worker only.';

CREATE VIEW outbox.events AS
SELECT l.id,
       l.biz_type,
       l.biz_key,
       l.topic,
       l.msg_key,
       l.payload,
       l.headers,
       COALESCE(s.status,
                CASE
                    WHEN pg_catalog.pg_visible_in_snapshot(l.tx, c.done_snapshot) THEN 'sent'
                    WHEN c.window_snapshot IS NULL
                         OR NOT pg_catalog.pg_visible_in_snapshot(l.tx, c.window_snapshot) THEN 'new'
                    WHEN ROW(l.tx, l.id) OPERATOR(pg_catalog.<=)
                         ROW(c.window_last_tx, c.window_last_id) THEN 'sent'
                    ELSE 'sending'
                END)                           AS status,
       COALESCE(s.attempts, 0)                AS attempts,
       COALESCE(s.next_attempt_at, l.created_at) AS next_attempt_at,
       l.created_at,
       COALESCE(s.updated_at, l.created_at)   AS updated_at,
       s.last_error,
       l.payload_bytes
  FROM outbox.event_log l
 CROSS JOIN outbox.relay_cursor c
  LEFT JOIN outbox.event_state s ON s.id OPERATOR(pg_catalog.=) l.id;

COMMENT ON VIEW outbox.events IS
    'One row per event with its delivery status: new, sending, sent or dead.';

CREATE TABLE outbox.consumer_dedup (
    consumer     text        NOT NULL,
    event_id     bigint      NOT NULL,
    biz_type     text,
    biz_key      text,
    processed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    source       text        NOT NULL DEFAULT '',
    CONSTRAINT consumer_dedup_pkey PRIMARY KEY (consumer, event_id, source),
    CONSTRAINT consumer_dedup_biz_key UNIQUE (consumer, biz_type, biz_key, source)
);

-- source is the outbox_source header of the claimed event ('' for a claim
-- made without one, as before 0.3.0): event ids and business keys are
-- unique per source, not across databases or clusters.  source comes last
-- in both keys: a claim without one looks for the event id or business key
-- under every source, and reads one range of the index for it, not every
-- claim of the consumer.
COMMENT ON TABLE outbox.consumer_dedup IS
    'Events a consumer has applied; written by outbox.claim() in the consumer''s transaction.';

-- Events and claims are user data: pg_dump must keep them.  The relay's
-- cursor too, so that a restore knows which restored events were sent
-- (see outbox._relay_cursor_restore below).
SELECT pg_catalog.pg_extension_config_dump('outbox.event_log', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.event_state', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.consumer_dedup', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.event_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.relay_cursor', '');

-- enqueue and claim run once per event, so they do not pin search_path:
-- setting and restoring it on every call cost a measurable part of
-- enqueue's time.  They are safe without it because every statement they
-- run names its tables, functions and operators with their schema.
CREATE FUNCTION outbox.enqueue(
    biz_type text,
    biz_key  text,
    payload  jsonb,
    topic    text  DEFAULT NULL,
    headers  jsonb DEFAULT NULL,
    msg_key  text  DEFAULT NULL)
RETURNS bigint
LANGUAGE C VOLATILE
SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_enqueue';

COMMENT ON FUNCTION outbox.enqueue(text, text, jsonb, text, jsonb, text) IS
    'Add an event to the outbox in the current transaction; returns its id. Idempotent on (biz_type, biz_key).';

-- Not an overload of enqueue: a driver's untyped JSON text would match
-- both, and the call would fail as ambiguous.
CREATE FUNCTION outbox.enqueue_bytes(
    biz_type text,
    biz_key  text,
    payload  bytea,
    topic    text  DEFAULT NULL,
    headers  jsonb DEFAULT NULL,
    msg_key  text  DEFAULT NULL)
RETURNS bigint
LANGUAGE C VOLATILE
SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_enqueue_bytes';

COMMENT ON FUNCTION outbox.enqueue_bytes(text, text, bytea, text, jsonb, text) IS
    'enqueue() with the message value as bytes, sent as they are (Avro, Protobuf, signed payloads); returns the event id.';

CREATE FUNCTION outbox.claim(
    consumer text,
    event_id bigint,
    biz_type text DEFAULT NULL,
    biz_key  text DEFAULT NULL)
RETURNS boolean
LANGUAGE C VOLATILE
SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_claim';

COMMENT ON FUNCTION outbox.claim(text, bigint, text, text) IS
    'Record that a consumer applies an event, in the current transaction: true the first time, false for a duplicate.';

-- The same, for an event of the given source (its outbox_source header).
CREATE FUNCTION outbox.claim(
    consumer text,
    event_id bigint,
    biz_type text,
    biz_key  text,
    source   text)
RETURNS boolean
LANGUAGE C VOLATILE
SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_claim';

COMMENT ON FUNCTION outbox.claim(text, bigint, text, text, text) IS
    'Record that a consumer applies an event of a source (its outbox_source header), in the current transaction: true the first time, false for a duplicate.';


-- Operations: pausing, dead letters and replay, figures, retention.

-- Whether the relay is paused; a table, so the state survives restarts.
CREATE TABLE outbox.relay_control (
    singleton  boolean     NOT NULL DEFAULT true,
    paused     boolean     NOT NULL DEFAULT false,
    changed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    changed_by name        NOT NULL DEFAULT session_user,
    CONSTRAINT relay_control_pkey PRIMARY KEY (singleton),
    CONSTRAINT relay_control_singleton CHECK (singleton)
);
INSERT INTO outbox.relay_control DEFAULT VALUES;
SELECT pg_catalog.pg_extension_config_dump('outbox.relay_control', '');

COMMENT ON TABLE outbox.relay_control IS
    'Whether the relay is paused; set with outbox.pause() and outbox.resume().';

-- outbox.stats finds the oldest unsent event by walking event_log in
-- created_at order; tx rides along so that the walk skips relayed events
-- inside the index, without a heap visit (see the view).  Claims are
-- removed oldest first; BRIN costs claim next to nothing, since
-- processed_at grows with insertion order.
CREATE INDEX event_log_created_at ON outbox.event_log (created_at, tx);
CREATE INDEX consumer_dedup_processed_at ON outbox.consumer_dedup USING brin (processed_at);
CREATE INDEX event_state_dead ON outbox.event_state (id) WHERE status = 'dead';

CREATE VIEW outbox.dead_letters AS
SELECT l.id, l.biz_type, l.biz_key, l.topic, l.msg_key, l.payload, l.headers,
       s.attempts, s.last_error, l.created_at, s.updated_at AS died_at,
       l.payload_bytes
  FROM outbox.event_state s
  JOIN outbox.event_log l ON l.id OPERATOR(pg_catalog.=) s.id
 WHERE s.status OPERATOR(pg_catalog.=) 'dead';

COMMENT ON VIEW outbox.dead_letters IS
    'Events the broker refused outbox.max_attempts times; outbox.replay() sends them again, outbox.discard() removes them.';

-- Set the relay's latch when the calling transaction commits.
CREATE FUNCTION outbox._wake_at_commit() RETURNS void
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'outbox_wake_at_commit';

CREATE FUNCTION outbox.relay_status(
    OUT pid                integer,
    OUT database           name,
    OUT state              text,
    OUT broker_state       text,
    OUT started_at         timestamptz,
    OUT last_batch_at      timestamptz,
    OUT last_error         text,
    OUT last_error_at      timestamptz,
    OUT sent_total         bigint,
    OUT failed_total       bigint,
    OUT retried_total      bigint,
    OUT sent_last_minute   bigint,
    OUT failed_last_minute bigint)
RETURNS SETOF record
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'outbox_relay_status';

COMMENT ON FUNCTION outbox.relay_status() IS
    'One row per running relay, from shared memory: state, broker, last error, totals since start; then one per database left without a relay (pid NULL, state ''waiting for a relay slot'' or ''waiting for lock'').';

-- Unsent: not yet relayed, or owned by the retry path and not finished
-- (event_state 'new' or 'sending').  Not yet relayed is read the way PgQ
-- reads a batch, from done_snapshot D: transactions that took their xid
-- after D (tx >= xmax(D), "fresh") plus those running at D (tx in
-- xip(D), "open"), minus the relayed part of the open window.  Never
-- "tx >= xmin(D)": that range holds every event since the oldest
-- transaction open at D, however long it stays open.
--
-- The cost stays bounded with a large backlog:
--   backlog  fresh events are counted up to 10,000 (a scan of
--            event_log_tx_id that stops there); above, they are estimated from the id
--            range: max(id) - (lowest id of the first 10,001) + 1.  The
--            open ones and the retry path's are counted exactly.
--   max_delay_sec  exact.  created_at is the enqueuing transaction's
--            start, in no order with tx or id: a transaction may start
--            early and take its xid after D.  Up to 10,000 fresh events
--            the scan above sees them all; above, the oldest is the first
--            fresh one in created_at order, a walk over
--            event_log_created_at whose tx column skips the events of
--            transactions older than D inside the index (only fresh ones
--            are read from the table, and the walk stops at the first that
--            is neither relayed in the window nor the retry path's).
-- The cursor's values are scalar subqueries, not a join: evaluated once,
-- the bounds are index conditions, and the planner, which cannot know the
-- cursor has one row, does not multiply its estimates (a plan costed past
-- jit_above_cost spent ~100 ms compiling itself).
CREATE VIEW outbox.stats AS
WITH fresh AS MATERIALIZED (
    SELECT l.tx, l.id, l.created_at
      FROM outbox.event_log l
     WHERE l.tx OPERATOR(pg_catalog.>=)
               (SELECT pg_catalog.pg_snapshot_xmax(c.done_snapshot) FROM outbox.relay_cursor c)
       AND NOT COALESCE(ROW(l.tx, l.id) OPERATOR(pg_catalog.<=)
                            ROW((SELECT c.window_last_tx FROM outbox.relay_cursor c),
                                (SELECT c.window_last_id FROM outbox.relay_cursor c))
                        AND pg_catalog.pg_visible_in_snapshot(
                                l.tx, (SELECT c.window_snapshot FROM outbox.relay_cursor c)), false)
     ORDER BY l.tx, l.id
     LIMIT 10001
), fresh_sum AS (
    -- The retry path's events are left out after the LIMIT, so that the
    -- planner may join the two sets as their sizes say (a probe per event
    -- cost three times the scan).
    SELECT (SELECT pg_catalog.count(*) FROM fresh) AS n,
           (SELECT l.id FROM fresh l ORDER BY l.tx DESC, l.id DESC LIMIT 1) AS last_id,
           pg_catalog.count(*) AS unsent,
           pg_catalog.min(f.created_at) AS oldest
      FROM fresh f
     WHERE NOT EXISTS (SELECT FROM outbox.event_state s WHERE s.id OPERATOR(pg_catalog.=) f.id)
), open AS MATERIALIZED (
    SELECT l.created_at
      FROM outbox.event_log l
     WHERE l.tx OPERATOR(pg_catalog.=) ANY (ARRAY(
               SELECT pg_catalog.pg_snapshot_xip(c.done_snapshot) FROM outbox.relay_cursor c))
       AND NOT COALESCE(ROW(l.tx, l.id) OPERATOR(pg_catalog.<=)
                            ROW((SELECT c.window_last_tx FROM outbox.relay_cursor c),
                                (SELECT c.window_last_id FROM outbox.relay_cursor c))
                        AND pg_catalog.pg_visible_in_snapshot(
                                l.tx, (SELECT c.window_snapshot FROM outbox.relay_cursor c)), false)
       AND NOT EXISTS (SELECT FROM outbox.event_state s WHERE s.id OPERATOR(pg_catalog.=) l.id)
), waiting AS MATERIALIZED (
    SELECT l.created_at, s.attempts, s.status
      FROM outbox.event_state s JOIN outbox.event_log l ON l.id OPERATOR(pg_catalog.=) s.id
     WHERE s.status OPERATOR(pg_catalog.=) ANY (ARRAY['new', 'sending'])
), relays AS (
    SELECT COALESCE(pg_catalog.sum(r.sent_last_minute), 0)::bigint AS sent,
           COALESCE(pg_catalog.sum(r.failed_last_minute), 0)::bigint AS failed,
           pg_catalog.min(r.state) AS state
      FROM outbox.relay_status() r
     WHERE r.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
)
SELECT CASE
           WHEN f.n OPERATOR(pg_catalog.<=) 10000 THEN f.unsent
           -- The rest, past the last row counted: the ids after it.
           ELSE f.unsent OPERATOR(pg_catalog.+) GREATEST(0,
                    (SELECT pg_catalog.max(l.id) FROM outbox.event_log l)
                        OPERATOR(pg_catalog.-) f.last_id)
       END
           OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM open)
           OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM waiting) AS backlog,
       COALESCE(pg_catalog.round(extract(epoch FROM pg_catalog.now() OPERATOR(pg_catalog.-) LEAST(
                    CASE
                        WHEN f.n OPERATOR(pg_catalog.<=) 10000 THEN f.oldest
                        ELSE (SELECT l.created_at
                                FROM outbox.event_log l
                               WHERE l.tx OPERATOR(pg_catalog.>=)
                                         (SELECT pg_catalog.pg_snapshot_xmax(c.done_snapshot)
                                            FROM outbox.relay_cursor c)
                                 AND NOT COALESCE(
                                         ROW(l.tx, l.id) OPERATOR(pg_catalog.<=)
                                             ROW((SELECT c.window_last_tx FROM outbox.relay_cursor c),
                                                 (SELECT c.window_last_id FROM outbox.relay_cursor c))
                                         AND pg_catalog.pg_visible_in_snapshot(
                                                 l.tx, (SELECT c.window_snapshot FROM outbox.relay_cursor c)),
                                         false)
                                 AND NOT EXISTS (SELECT FROM outbox.event_state s
                                                  WHERE s.id OPERATOR(pg_catalog.=) l.id)
                               ORDER BY l.created_at
                               LIMIT 1)
                    END,
                    (SELECT pg_catalog.min(created_at) FROM open),
                    (SELECT pg_catalog.min(created_at) FROM waiting))), 3), 0) AS max_delay_sec,
       (SELECT pg_catalog.count(*) FROM outbox.event_state
         WHERE status OPERATOR(pg_catalog.=) 'dead') AS dead,
       relays.sent AS sent_last_minute,
       relays.failed AS failed_last_minute,
       -- Failed before, or in flight one by one (its topic stuck).
       (SELECT pg_catalog.count(*) FROM waiting
         WHERE attempts OPERATOR(pg_catalog.>) 0
            OR status OPERATOR(pg_catalog.=) 'sending') AS retrying,
       -- This database's relay, as relay_status() says: 'waiting for a
       -- relay slot' when the launcher left it without one.
       relays.state AS relay_state
  FROM fresh_sum f, relays;

COMMENT ON VIEW outbox.stats IS
    'Backlog, age of the oldest unsent event, dead letters and the last minute''s deliveries, in one row. backlog is exact up to 10,000 events committed since the relay''s last snapshot, estimated above that as the first 10,001 counted plus the ids after the last of them (ids of rolled-back or uncommitted enqueues count too); max_delay_sec, dead and retrying are exact. relay_state is this database''s relay''s state from relay_status(), ''waiting for a relay slot'' when it has none for want of slots, NULL when no relay is known.';

-- Set the pause flag and wake the relay to notice it.
CREATE FUNCTION outbox._set_paused(paused boolean) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE outbox.relay_control
       SET paused = _set_paused.paused, changed_at = pg_catalog.now(), changed_by = session_user;
    SELECT outbox._wake_at_commit();
$$;

CREATE FUNCTION outbox.pause() RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT outbox._set_paused(true) $$;

COMMENT ON FUNCTION outbox.pause() IS
    'Stop relaying (events wait) until outbox.resume(); kept across restarts.';

CREATE FUNCTION outbox.resume() RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT outbox._set_paused(false) $$;

COMMENT ON FUNCTION outbox.resume() IS 'Relay again after outbox.pause().';

CREATE FUNCTION outbox.replay(event_id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF replay.event_id IS NULL THEN
        RAISE EXCEPTION 'event_id must not be null' USING ERRCODE = '22004';
    END IF;
    UPDATE outbox.event_state s
       SET status = 'new', attempts = 0,
           next_attempt_at = pg_catalog.now(), updated_at = pg_catalog.now()
     WHERE s.id OPERATOR(pg_catalog.=) replay.event_id
       AND s.status OPERATOR(pg_catalog.=) 'dead';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM outbox._wake_at_commit();
    RETURN true;
END $$;

COMMENT ON FUNCTION outbox.replay(bigint) IS
    'Send a dead event again, with attempts reset and the same id; false if it is not dead. It reaches Kafka after the events of its key sent while it was dead, before those not sent yet.';

CREATE FUNCTION outbox.replay_dead(biz_type text DEFAULT NULL, since timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n pg_catalog.int8;
BEGIN
    UPDATE outbox.event_state s
       SET status = 'new', attempts = 0,
           next_attempt_at = pg_catalog.now(), updated_at = pg_catalog.now()
      FROM outbox.event_log l
     WHERE l.id OPERATOR(pg_catalog.=) s.id AND s.status OPERATOR(pg_catalog.=) 'dead'
       AND (replay_dead.biz_type IS NULL OR l.biz_type OPERATOR(pg_catalog.=) replay_dead.biz_type)
       AND (replay_dead.since IS NULL OR s.updated_at OPERATOR(pg_catalog.>=) replay_dead.since);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n OPERATOR(pg_catalog.>) 0 THEN
        PERFORM outbox._wake_at_commit();
    END IF;
    RETURN n;
END $$;

COMMENT ON FUNCTION outbox.replay_dead(text, timestamptz) IS
    'Send again every dead event (of biz_type, dead since since), each as replay() does; returns how many.';

-- Dead letters an operator is done with.  discard removes a dead event for
-- good, and its event_state row: the business key is free again, so an
-- enqueue of it makes a new event (a new id), which is sent.  While the
-- dead event is kept, that enqueue gets the dead id back and nothing goes.
-- Only a dead event: any other is the relay's (retention removes the sent
-- ones), and discard says false for it, as replay does.
--
-- Locks: the event, then its state, in the order retention and resend
-- take them.  FOR UPDATE rechecks the row it waited for: a replay that
-- committed meanwhile (the event 'new' again, perhaps in the relay's
-- hands) makes the answer false.  The relay reads only 'new' and
-- 'sending' rows, and any writer of a state row holds its lock, so
-- nothing the relay does meets a half-discarded event.  A producer whose
-- enqueue got the dead id holds FOR KEY SHARE on the event until its
-- transaction ends: discard waits for it (it was told the event exists).
--
-- The trace is one LOG line per event, beside the one the relay wrote when
-- it died: id, topic, keys, attempts, last error and role, not the
-- payload.  Not a table: it would need its own retention, grants and dump,
-- and would keep what the operator chose to remove; to keep a copy, insert
-- the event's outbox.dead_letters row elsewhere first (docs/operations.md).
CREATE FUNCTION outbox.discard(event_id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e record;
BEGIN
    IF discard.event_id IS NULL THEN
        RAISE EXCEPTION 'event_id must not be null' USING ERRCODE = '22004';
    END IF;
    SELECT l.id, l.topic, l.msg_key, l.biz_type, l.biz_key, s.attempts, s.last_error INTO e
      FROM outbox.event_log l JOIN outbox.event_state s ON s.id OPERATOR(pg_catalog.=) l.id
     WHERE l.id OPERATOR(pg_catalog.=) discard.event_id
       AND s.status OPERATOR(pg_catalog.=) 'dead'
       FOR UPDATE OF l, s;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM outbox.event_state s WHERE s.id OPERATOR(pg_catalog.=) e.id;
    DELETE FROM outbox.event_log l WHERE l.id OPERATOR(pg_catalog.=) e.id;
    RAISE LOG USING
        MESSAGE = pg_catalog.format('outbox: dead event %s of topic "%s" discarded', e.id, e.topic),
        DETAIL = pg_catalog.format(
            'Its biz_type was "%s", its biz_key "%s" and its msg_key "%s"; it was dead after %s '
            'failed attempts, the last: %s.  Role "%s" discarded it.',
            e.biz_type, e.biz_key, e.msg_key, e.attempts,
            COALESCE(e.last_error, 'unknown'), session_user);
    RETURN true;
END $$;

COMMENT ON FUNCTION outbox.discard(bigint) IS
    'Remove a dead event for good, so that its business key is free for a new enqueue; false if it is not dead. Logged.';

CREATE FUNCTION outbox.discard_dead(biz_type text DEFAULT NULL, since timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    dead_id pg_catalog.int8;
    n  pg_catalog.int8 := 0;
BEGIN
    FOR dead_id IN
        SELECT s.id
          FROM outbox.event_state s JOIN outbox.event_log l ON l.id OPERATOR(pg_catalog.=) s.id
         WHERE s.status OPERATOR(pg_catalog.=) 'dead'
           AND (discard_dead.biz_type IS NULL OR l.biz_type OPERATOR(pg_catalog.=) discard_dead.biz_type)
           AND (discard_dead.since IS NULL OR s.updated_at OPERATOR(pg_catalog.>=) discard_dead.since)
         ORDER BY s.id
    LOOP
        IF outbox.discard(dead_id) THEN
            n := n OPERATOR(pg_catalog.+) 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

COMMENT ON FUNCTION outbox.discard_dead(text, timestamptz) IS
    'Remove every dead event (of biz_type, dead since since), each as discard() does; returns how many.';

-- One bounded round of retention, run by the relay: sent events older
-- than sent_retention and claims older than dedup_retention, at most
-- batch_rows of each.  Dead and waiting events are kept.
--
-- It never waits for a row lock: a producer whose enqueue got the
-- duplicate answer holds FOR KEY SHARE on that event until its transaction
-- ends, a consumer's duplicate claim the same on the claim, and a DELETE
-- waiting behind either would stop the relay for as long as the
-- application keeps its transaction open.  Victims are locked with SKIP
-- LOCKED first (the LIMIT counts only rows locked); a skipped row goes in
-- a later round.  The state rows of victims are written only by the relay
-- itself and by outbox.resend(), which updates the event first, so
-- deleting them does not wait either.
CREATE FUNCTION outbox._purge(sent_retention interval, dedup_retention interval, batch_rows integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- (OPERATOR() forms all bind alike, left to right: no two in one expression.)
    sent_before  pg_catalog.timestamptz := pg_catalog.now() OPERATOR(pg_catalog.-) sent_retention;
    claim_before pg_catalog.timestamptz := pg_catalog.now() OPERATOR(pg_catalog.-) dedup_retention;
    events       pg_catalog.int8;
    claims       pg_catalog.int8;
BEGIN
    -- Victims lie below the first event young enough to keep (ids grow
    -- with time): bounding the scan there reads only the old end of the
    -- table, instead of every kept event when there is nothing to remove.
    WITH bound AS (
        SELECT COALESCE((SELECT k.id FROM outbox.event_log k
                          WHERE k.created_at OPERATOR(pg_catalog.>=) sent_before
                          ORDER BY k.id LIMIT 1), 9223372036854775807) AS id
    ), victims AS (
        SELECT l.id
          FROM outbox.event_log l, outbox.relay_cursor c
         WHERE l.id OPERATOR(pg_catalog.<) (SELECT id FROM bound)
           AND l.created_at OPERATOR(pg_catalog.<) sent_before
           AND pg_catalog.pg_visible_in_snapshot(l.tx, c.done_snapshot)
           AND NOT EXISTS (SELECT 1 FROM outbox.event_state s
                            WHERE s.id OPERATOR(pg_catalog.=) l.id
                              AND s.status OPERATOR(pg_catalog.<>) 'sent')
         LIMIT batch_rows
           FOR UPDATE OF l SKIP LOCKED
    ), gone AS (
        DELETE FROM outbox.event_log l USING victims v
         WHERE l.id OPERATOR(pg_catalog.=) v.id RETURNING l.id
    ), state_gone AS (
        DELETE FROM outbox.event_state s USING gone g WHERE s.id OPERATOR(pg_catalog.=) g.id
    )
    SELECT pg_catalog.count(*) INTO events FROM gone;

    DELETE FROM outbox.consumer_dedup
     WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
               SELECT d.ctid FROM outbox.consumer_dedup d
                WHERE d.processed_at OPERATOR(pg_catalog.<) claim_before
                LIMIT batch_rows
                  FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS claims = ROW_COUNT;
    RETURN events OPERATOR(pg_catalog.+) claims;
END $$;

-- Restoring a dump.  pg_dump keeps relay_control and relay_cursor, and a
-- restore runs CREATE EXTENSION first, which makes a row in each: the
-- restored rows arrive as second rows.  Two triggers fold them into the
-- rows CREATE EXTENSION made, so a dump restores in one transaction
-- (psql -1 -v ON_ERROR_STOP=1).  pg_restore -j is not supported: it may
-- load relay_cursor before event_log.

-- The restored pause state replaces the default one.
CREATE FUNCTION outbox._relay_control_restore() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE outbox.relay_control
       SET paused = NEW.paused, changed_at = NEW.changed_at, changed_by = NEW.changed_by;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;             -- the row CREATE EXTENSION makes
END $$;

CREATE TRIGGER relay_control_restore BEFORE INSERT ON outbox.relay_control
    FOR EACH ROW EXECUTE FUNCTION outbox._relay_control_restore();

-- A restored cursor (NEW) says which restored events the source had sent,
-- but its snapshots and the events' tx values are the source's: the kept
-- cursor, made by CREATE EXTENSION, cannot judge them.  pg_dump loads
-- table data in name order, so every event (event_log, event_state) is in
-- when the cursor arrives.  Each event is judged under NEW exactly as
-- outbox.events does; the source's xids and snapshots agree with each
-- other, so the rule is the same into the same cluster or another one:
--   sent under NEW, or with an event_state row (the retry path owns it,
--   whatever its status): tx = 2, the frozen xid, visible in every
--   snapshot, so the window path never sends it again;
--   unsent under NEW: tx = this transaction, which the relay sends after
--   the restore commits.
-- Then NEW is dropped.  Only a superuser or the owner can insert here, so
-- no SECURITY DEFINER; the trigger does not fire for the relay's UPDATEs.
CREATE FUNCTION outbox._relay_cursor_restore() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    me pg_catalog.xid8 := pg_catalog.pg_current_xact_id();
BEGIN
    IF NOT EXISTS (SELECT FROM outbox.relay_cursor) THEN
        RETURN NEW;         -- the row CREATE EXTENSION makes
    END IF;

    UPDATE outbox.event_log l
       SET tx = CASE
                    WHEN EXISTS (SELECT FROM outbox.event_state s
                                  WHERE s.id OPERATOR(pg_catalog.=) l.id)
                      OR pg_catalog.pg_visible_in_snapshot(l.tx, NEW.done_snapshot)
                      OR (NEW.window_snapshot IS NOT NULL
                          AND pg_catalog.pg_visible_in_snapshot(l.tx, NEW.window_snapshot)
                          AND ROW(l.tx, l.id) OPERATOR(pg_catalog.<=)
                              ROW(NEW.window_last_tx, NEW.window_last_id))
                    THEN '2'::pg_catalog.xid8
                    ELSE me
                END;

    -- The kept cursor was made in this very transaction, and a snapshot
    -- does not list its own transaction as running: once a later xid has
    -- ended, this one looks committed to it.  List it, so that the events
    -- just given this xid count as unsent.
    UPDATE outbox.relay_cursor c
       SET done_snapshot = pg_catalog.concat_ws(':',
               pg_catalog.pg_snapshot_xmin(c.done_snapshot),
               pg_catalog.pg_snapshot_xmax(c.done_snapshot),
               pg_catalog.array_to_string(ARRAY(
                   SELECT x FROM pg_catalog.pg_snapshot_xip(c.done_snapshot) x
                   UNION SELECT me ORDER BY 1), ','))::pg_catalog.pg_snapshot
     WHERE pg_catalog.pg_visible_in_snapshot(me, c.done_snapshot);

    -- The source is the database's history (src/sender.c): the restored
    -- events keep their identity, so a claiming consumer refuses those
    -- the original had sent.  New ones differ by their incarnation.
    UPDATE outbox.relay_cursor
       SET source = COALESCE(NEW.source, source);
    RETURN NULL;
END $$;

CREATE TRIGGER relay_cursor_restore BEFORE INSERT ON outbox.relay_cursor
    FOR EACH ROW EXECUTE FUNCTION outbox._relay_cursor_restore();

-- The operator's tool when the relay's progress did not come with the
-- data: a dump made by outbox 0.1.0 (no cursor in it), or a copy to send
-- into a new Kafka cluster.  Each kept event created at or after since,
-- unless dead, is given this transaction's xid, as if enqueued now: the
-- relay sends it after the commit, by the window path, in id order per key.
-- A failure state is dropped with it (dead events keep theirs).
CREATE FUNCTION outbox.resend(since timestamptz) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n pg_catalog.int8;
BEGIN
    IF resend.since IS NULL THEN
        RAISE EXCEPTION 'since must not be null' USING ERRCODE = '22004';
    END IF;
    WITH marked AS (
        UPDATE outbox.event_log l
           SET tx = pg_catalog.pg_current_xact_id()
         WHERE l.created_at OPERATOR(pg_catalog.>=) resend.since
           AND NOT EXISTS (SELECT FROM outbox.event_state s
                            WHERE s.id OPERATOR(pg_catalog.=) l.id
                              AND s.status OPERATOR(pg_catalog.=) 'dead')
        RETURNING l.id
    ), cleared AS (
        DELETE FROM outbox.event_state s USING marked m WHERE s.id OPERATOR(pg_catalog.=) m.id
    )
    SELECT pg_catalog.count(*) INTO n FROM marked;
    IF n OPERATOR(pg_catalog.>) 0 THEN
        PERFORM outbox._wake_at_commit();
    END IF;
    RETURN n;
END $$;

COMMENT ON FUNCTION outbox.resend(timestamptz) IS
    'Send again every kept event created at or after since, except dead ones; returns how many. For restores without the relay''s progress.';

-- Least privilege: nobody but the owner gets anything until granted.
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;
