-- outbox 0.1.0: the outbox tables, enqueue and claim.
--
-- Physical layout, chosen for the relay's throughput:
--   event_log     append-only: one INSERT per event, never updated.  The
--                 relay reads it by transaction snapshot (column tx), the
--                 way PgQ does, so the happy path needs no per-event UPDATE.
--   relay_cursor  one row: how far the relay has got, as snapshots.
--   event_state   sparse: a row only for an event whose delivery failed,
--                 is waiting for a retry, or is dead.
--   events        the view users read: one row per event with its status,
--                 derived from the three above.

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

CREATE SEQUENCE outbox.event_id_seq;

CREATE TABLE outbox.event_log (
    id          bigint      NOT NULL DEFAULT nextval('outbox.event_id_seq'),
    tx          xid8        NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    biz_type    text        NOT NULL,
    biz_key     text        NOT NULL,
    topic       text        NOT NULL,
    msg_key     text        NOT NULL,
    payload     jsonb       NOT NULL,
    headers     jsonb,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT event_log_pkey PRIMARY KEY (id),
    CONSTRAINT event_log_biz_key UNIQUE (biz_type, biz_key)
);
ALTER SEQUENCE outbox.event_id_seq OWNED BY outbox.event_log.id;

-- The relay selects "committed since the last snapshot" by tx.
CREATE INDEX event_log_tx ON outbox.event_log (tx);

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

-- Events waiting for a retry, in id order; also the keys they hold back.
CREATE INDEX event_state_pending ON outbox.event_state (id) WHERE status = 'new';

COMMENT ON TABLE outbox.event_state IS
    'Delivery state of events that needed more than one try; absent means no failure so far.';

-- The relay works in windows: every event whose transaction is visible in
-- done_snapshot has been relayed; the open window covers the events visible
-- in window_snapshot but not in done_snapshot, and of those it has relayed
-- the ones with id <= window_last_id (it sends a window in id order).
CREATE TABLE outbox.relay_cursor (
    singleton       boolean     NOT NULL DEFAULT true,
    done_snapshot   pg_snapshot NOT NULL,
    window_snapshot pg_snapshot,
    window_last_id  bigint      NOT NULL DEFAULT 0,
    window_max_id   bigint      NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
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
                    WHEN l.id <= c.window_last_id THEN 'sent'
                    ELSE 'sending'
                END)                           AS status,
       COALESCE(s.attempts, 0)                AS attempts,
       COALESCE(s.next_attempt_at, l.created_at) AS next_attempt_at,
       l.created_at,
       COALESCE(s.updated_at, l.created_at)   AS updated_at,
       s.last_error
  FROM outbox.event_log l
 CROSS JOIN outbox.relay_cursor c
  LEFT JOIN outbox.event_state s ON s.id = l.id;

COMMENT ON VIEW outbox.events IS
    'One row per event with its delivery status: new, sending, sent or dead.';

CREATE TABLE outbox.consumer_dedup (
    consumer     text        NOT NULL,
    event_id     bigint      NOT NULL,
    biz_type     text,
    biz_key      text,
    processed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT consumer_dedup_pkey PRIMARY KEY (consumer, event_id),
    CONSTRAINT consumer_dedup_biz_key UNIQUE (consumer, biz_type, biz_key)
);

COMMENT ON TABLE outbox.consumer_dedup IS
    'Events a consumer has applied; written by outbox.claim() in the consumer''s transaction.';

-- Events and claims are user data: pg_dump must keep them.
SELECT pg_catalog.pg_extension_config_dump('outbox.event_log', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.event_state', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.consumer_dedup', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.event_id_seq', '');

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
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_enqueue';

COMMENT ON FUNCTION outbox.enqueue(text, text, jsonb, text, jsonb, text) IS
    'Add an event to the outbox in the current transaction; returns its id. Idempotent on (biz_type, biz_key).';

CREATE FUNCTION outbox.claim(
    consumer text,
    event_id bigint,
    biz_type text DEFAULT NULL,
    biz_key  text DEFAULT NULL)
RETURNS boolean
LANGUAGE C VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_claim';

COMMENT ON FUNCTION outbox.claim(text, bigint, text, text) IS
    'Record that a consumer applies an event, in the current transaction: true the first time, false for a duplicate.';


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

-- Retention removes the oldest rows first; BRIN costs enqueue and claim
-- next to nothing, since both columns grow with insertion order.
CREATE INDEX event_log_created_at ON outbox.event_log USING brin (created_at);
CREATE INDEX consumer_dedup_processed_at ON outbox.consumer_dedup USING brin (processed_at);
CREATE INDEX event_state_dead ON outbox.event_state (id) WHERE status = 'dead';

CREATE VIEW outbox.dead_letters AS
SELECT l.id, l.biz_type, l.biz_key, l.topic, l.msg_key, l.payload, l.headers,
       s.attempts, s.last_error, l.created_at, s.updated_at AS died_at
  FROM outbox.event_state s
  JOIN outbox.event_log l ON l.id = s.id
 WHERE s.status = 'dead';

COMMENT ON VIEW outbox.dead_letters IS
    'Events the broker refused outbox.max_attempts times; outbox.replay() sends them again.';

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
    'One row per running relay, from shared memory: state, broker, last error, totals since start.';

-- Unsent: not yet relayed (outside done_snapshot and the relayed part of
-- the open window) or waiting for a retry.  Both come from index ranges
-- that stay small while the relay keeps up, whatever the table's size.
CREATE VIEW outbox.stats AS
WITH cursor AS (
    SELECT * FROM outbox.relay_cursor
), unrelayed AS (
    -- The bound as a scalar subquery is an index condition on tx: only
    -- the unrelayed end of the table is read, not every kept event.
    SELECT l.created_at
      FROM outbox.event_log l, cursor c
     WHERE l.tx >= (SELECT pg_catalog.pg_snapshot_xmin(done_snapshot) FROM outbox.relay_cursor)
       AND NOT pg_catalog.pg_visible_in_snapshot(l.tx, c.done_snapshot)
       AND NOT (c.window_snapshot IS NOT NULL
                AND pg_catalog.pg_visible_in_snapshot(l.tx, c.window_snapshot)
                AND l.id <= c.window_last_id)
       AND NOT EXISTS (SELECT 1 FROM outbox.event_state s WHERE s.id = l.id)
), waiting AS (
    SELECT l.created_at, s.attempts
      FROM outbox.event_state s JOIN outbox.event_log l ON l.id = s.id
     WHERE s.status = 'new'
), relays AS (
    SELECT COALESCE(sum(r.sent_last_minute), 0)::bigint AS sent,
           COALESCE(sum(r.failed_last_minute), 0)::bigint AS failed
      FROM outbox.relay_status() r
)
SELECT (SELECT count(*) FROM unrelayed) + (SELECT count(*) FROM waiting) AS backlog,
       COALESCE(round(extract(epoch FROM pg_catalog.now() - LEAST(
                    (SELECT min(created_at) FROM unrelayed),
                    (SELECT min(created_at) FROM waiting))), 3), 0) AS max_delay_sec,
       (SELECT count(*) FROM outbox.event_state WHERE status = 'dead') AS dead,
       relays.sent AS sent_last_minute,
       relays.failed AS failed_last_minute,
       (SELECT count(*) FROM waiting WHERE attempts > 0) AS retrying
  FROM relays;

COMMENT ON VIEW outbox.stats IS
    'Backlog, age of the oldest unsent event, dead letters and the last minute''s deliveries, in one row.';

-- Set the pause flag and wake the relay to notice it.
CREATE FUNCTION outbox._set_paused(paused boolean) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE outbox.relay_control
       SET paused = _set_paused.paused, changed_at = now(), changed_by = session_user;
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
       SET status = 'new', attempts = 0, next_attempt_at = now(), updated_at = now()
     WHERE s.id = replay.event_id AND s.status = 'dead';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM outbox._wake_at_commit();
    RETURN true;
END $$;

COMMENT ON FUNCTION outbox.replay(bigint) IS
    'Send a dead event again, with attempts reset and the same id; false if it is not dead.';

CREATE FUNCTION outbox.replay_dead(biz_type text DEFAULT NULL, since timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    UPDATE outbox.event_state s
       SET status = 'new', attempts = 0, next_attempt_at = now(), updated_at = now()
      FROM outbox.event_log l
     WHERE l.id = s.id AND s.status = 'dead'
       AND (replay_dead.biz_type IS NULL OR l.biz_type = replay_dead.biz_type)
       AND (replay_dead.since IS NULL OR s.updated_at >= replay_dead.since);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM outbox._wake_at_commit();
    END IF;
    RETURN n;
END $$;

COMMENT ON FUNCTION outbox.replay_dead(text, timestamptz) IS
    'Send again every dead event (of biz_type, dead since since); returns how many.';

-- One bounded round of retention, run by the relay: sent events older
-- than sent_retention and claims older than dedup_retention, at most
-- batch_rows of each.  Dead and waiting events are kept.
CREATE FUNCTION outbox._purge(sent_retention interval, dedup_retention interval, batch_rows integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    events bigint;
    claims bigint;
BEGIN
    -- Victims lie below the first event young enough to keep (ids grow
    -- with time): bounding the scan there reads only the old end of the
    -- table, instead of every kept event when there is nothing to remove.
    WITH bound AS (
        SELECT COALESCE((SELECT k.id FROM outbox.event_log k
                          WHERE k.created_at >= now() - sent_retention
                          ORDER BY k.id LIMIT 1), 9223372036854775807) AS id
    ), victims AS (
        SELECT l.id
          FROM outbox.event_log l, outbox.relay_cursor c
         WHERE l.id < (SELECT id FROM bound)
           AND l.created_at < now() - sent_retention
           AND pg_visible_in_snapshot(l.tx, c.done_snapshot)
           AND NOT EXISTS (SELECT 1 FROM outbox.event_state s
                            WHERE s.id = l.id AND s.status <> 'sent')
         LIMIT batch_rows
    ), gone AS (
        DELETE FROM outbox.event_log l USING victims v WHERE l.id = v.id RETURNING l.id
    ), state_gone AS (
        DELETE FROM outbox.event_state s USING gone g WHERE s.id = g.id
    )
    SELECT count(*) INTO events FROM gone;

    DELETE FROM outbox.consumer_dedup
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM outbox.consumer_dedup
                              WHERE processed_at < now() - dedup_retention
                              LIMIT batch_rows));
    GET DIAGNOSTICS claims = ROW_COUNT;
    RETURN events + claims;
END $$;

-- Least privilege: nobody but the owner gets anything until granted.
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;
