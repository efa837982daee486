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

-- Least privilege: nobody but the owner gets anything until granted.
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.enqueue(text, text, jsonb, text, jsonb, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.claim(text, bigint, text, text) FROM PUBLIC;
