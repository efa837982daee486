-- pgTAP: the schema and API contract clients and operators rely on.
\set ECHO none
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pgtap;
RESET client_min_messages;
BEGIN;
SELECT plan(72);

SELECT has_schema('outbox');
SELECT has_table('outbox', 'event_log', 'event_log table');
SELECT has_table('outbox', 'event_state', 'event_state table');
SELECT has_view('outbox', 'events', 'events view');
SELECT has_table('outbox', 'consumer_dedup', 'consumer_dedup table');

SELECT columns_are('outbox', 'events', ARRAY[
    'id', 'biz_type', 'biz_key', 'topic', 'msg_key', 'payload', 'headers',
    'status', 'attempts', 'next_attempt_at', 'created_at', 'updated_at',
    'last_error', 'payload_bytes'], 'events has the documented columns');
SELECT col_type_is('outbox', 'events', 'id', 'bigint', 'events.id is bigint');
SELECT col_type_is('outbox', 'events', 'payload', 'jsonb', 'events.payload is jsonb');
SELECT col_type_is('outbox', 'events', 'payload_bytes', 'bytea', 'events.payload_bytes is bytea');
SELECT col_type_is('outbox', 'events', 'headers', 'jsonb', 'events.headers is jsonb');
SELECT col_type_is('outbox', 'events', 'status', 'text', 'events.status is text');
SELECT col_type_is('outbox', 'events', 'attempts', 'integer', 'events.attempts is integer');
SELECT col_type_is('outbox', 'events', 'next_attempt_at', 'timestamp with time zone', 'events.next_attempt_at is timestamptz');
SELECT col_type_is('outbox', 'events', 'last_error', 'text', 'events.last_error is text');

SELECT col_is_pk('outbox', 'event_log', 'id', 'event_log keyed by id');
SELECT col_is_unique('outbox', 'event_log', ARRAY['biz_type', 'biz_key'], 'one event per business key');
SELECT col_default_is('outbox', 'event_log', 'id', 'nextval(''outbox.event_id_seq''::regclass)', 'ids come from the sequence');
SELECT has_index('outbox', 'event_log', 'event_log_tx_id', ARRAY['tx', 'id'], 'relay reads windows in (tx, id) order');
SELECT col_is_pk('outbox', 'consumer_dedup', ARRAY['consumer', 'event_id', 'source'], 'one claim per consumer, source and event');
SELECT col_is_unique('outbox', 'consumer_dedup', ARRAY['consumer', 'biz_type', 'biz_key', 'source'], 'one claim per consumer, source and business key');
SELECT col_not_null('outbox', 'consumer_dedup', 'processed_at', 'claims are time-stamped');

SELECT has_function('outbox', 'enqueue', ARRAY['text', 'text', 'jsonb', 'text', 'jsonb', 'text'], 'enqueue signature');
SELECT function_returns('outbox', 'enqueue', ARRAY['text', 'text', 'jsonb', 'text', 'jsonb', 'text'], 'bigint', 'enqueue returns the id');
SELECT is_definer('outbox', 'enqueue', ARRAY['text', 'text', 'jsonb', 'text', 'jsonb', 'text'], 'enqueue runs with the owner''s rights');
SELECT volatility_is('outbox', 'enqueue', ARRAY['text', 'text', 'jsonb', 'text', 'jsonb', 'text'], 'volatile', 'enqueue is volatile');
SELECT is(
    (SELECT proargnames FROM pg_proc WHERE oid = 'outbox.enqueue(text,text,jsonb,text,jsonb,text)'::regprocedure),
    ARRAY['biz_type', 'biz_key', 'payload', 'topic', 'headers', 'msg_key'],
    'enqueue parameter names');
SELECT is(
    (SELECT pronargdefaults FROM pg_proc WHERE oid = 'outbox.enqueue(text,text,jsonb,text,jsonb,text)'::regprocedure)::int,
    3, 'enqueue: topic, headers and msg_key are optional');

SELECT has_function('outbox', 'enqueue_bytes', ARRAY['text', 'text', 'bytea', 'text', 'jsonb', 'text'], 'enqueue_bytes signature');
SELECT function_returns('outbox', 'enqueue_bytes', ARRAY['text', 'text', 'bytea', 'text', 'jsonb', 'text'], 'bigint', 'enqueue_bytes returns the id');
SELECT is_definer('outbox', 'enqueue_bytes', ARRAY['text', 'text', 'bytea', 'text', 'jsonb', 'text'], 'enqueue_bytes runs with the owner''s rights');
SELECT is(
    (SELECT proargnames FROM pg_proc WHERE oid = 'outbox.enqueue_bytes(text,text,bytea,text,jsonb,text)'::regprocedure),
    ARRAY['biz_type', 'biz_key', 'payload', 'topic', 'headers', 'msg_key'],
    'enqueue_bytes parameter names, enqueue''s');

SELECT has_function('outbox', 'claim', ARRAY['text', 'bigint', 'text', 'text'], 'claim signature');
SELECT function_returns('outbox', 'claim', ARRAY['text', 'bigint', 'text', 'text'], 'boolean', 'claim returns boolean');
SELECT is_definer('outbox', 'claim', ARRAY['text', 'bigint', 'text', 'text'], 'claim runs with the owner''s rights');
SELECT is(
    (SELECT proargnames FROM pg_proc WHERE oid = 'outbox.claim(text,bigint,text,text)'::regprocedure),
    ARRAY['consumer', 'event_id', 'biz_type', 'biz_key'],
    'claim parameter names');
-- enqueue and claim run per event: no search_path set and restored on
-- each call (their statements are qualified instead).  Every other
-- function with the owner's rights, and every SQL or PL/pgSQL one, pins it.
SELECT is(
    (SELECT proconfig FROM pg_proc WHERE oid = 'outbox.claim(text,bigint,text,text)'::regprocedure),
    NULL, 'claim sets no search_path');
SELECT is(
    (SELECT proconfig FROM pg_proc WHERE oid = 'outbox.enqueue(text,text,jsonb,text,jsonb,text)'::regprocedure),
    NULL, 'enqueue sets no search_path');
SELECT is(
    (SELECT proconfig FROM pg_proc WHERE oid = 'outbox.enqueue_bytes(text,text,bytea,text,jsonb,text)'::regprocedure),
    NULL, 'enqueue_bytes sets no search_path');
SELECT is(
    ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
           WHERE p.pronamespace = 'outbox'::regnamespace
             AND (p.prosecdef OR l.lanname IN ('sql', 'plpgsql'))
             AND p.oid NOT IN ('outbox.claim(text,bigint,text,text)'::regprocedure,
                               'outbox.claim(text,bigint,text,text,text)'::regprocedure,
                               'outbox.enqueue(text,text,jsonb,text,jsonb,text)'::regprocedure,
                               'outbox.enqueue_bytes(text,text,bytea,text,jsonb,text)'::regprocedure)
             AND p.proconfig IS DISTINCT FROM ARRAY['search_path=pg_catalog, pg_temp']
           ORDER BY 1),
    '{}'::text[], 'every other definer, SQL and PL/pgSQL function pins search_path');

SELECT function_privs_are('outbox', 'enqueue', ARRAY['text', 'text', 'jsonb', 'text', 'jsonb', 'text'], 'public', '{}'::text[], 'PUBLIC cannot enqueue');
SELECT function_privs_are('outbox', 'enqueue_bytes', ARRAY['text', 'text', 'bytea', 'text', 'jsonb', 'text'], 'public', '{}'::text[], 'PUBLIC cannot enqueue_bytes');
SELECT function_privs_are('outbox', 'claim', ARRAY['text', 'bigint', 'text', 'text'], 'public', '{}'::text[], 'PUBLIC cannot claim');
SELECT function_privs_are('outbox', 'claim', ARRAY['text', 'bigint', 'text', 'text', 'text'], 'public', '{}'::text[], 'PUBLIC cannot claim for a source');
SELECT table_privs_are('outbox', 'event_log', 'public', '{}'::text[], 'PUBLIC has no rights on event_log');
SELECT table_privs_are('outbox', 'events', 'public', '{}'::text[], 'PUBLIC has no rights on events');
SELECT table_privs_are('outbox', 'consumer_dedup', 'public', '{}'::text[], 'PUBLIC has no rights on consumer_dedup');

SELECT throws_ok($$SELECT outbox.enqueue(NULL, 'k', '{}')$$, '22004', 'biz_type must not be null', 'null biz_type: 22004');
SELECT throws_ok($$SELECT outbox.enqueue('T', 'k', '{}', topic => 'no spaces')$$, '22023', NULL, 'bad topic: 22023');
SELECT throws_ok($$SELECT outbox.claim('c', NULL)$$, '22004', 'event_id must not be null', 'null event_id: 22004');

SELECT has_view('outbox', 'stats', 'stats view');
SELECT columns_are('outbox', 'stats', ARRAY['backlog', 'max_delay_sec', 'dead', 'sent_last_minute',
    'failed_last_minute', 'retrying', 'relay_state'], 'stats has the documented columns');
SELECT has_view('outbox', 'dead_letters', 'dead_letters view');
SELECT has_function('outbox', 'relay_status', '{}'::text[], 'relay_status()');
SELECT has_function('outbox', 'pause', '{}'::text[], 'pause()');
SELECT has_function('outbox', 'resume', '{}'::text[], 'resume()');
SELECT function_returns('outbox', 'replay', ARRAY['bigint'], 'boolean', 'replay(event_id) returns boolean');
SELECT function_returns('outbox', 'replay_dead', ARRAY['text', 'timestamp with time zone'], 'bigint', 'replay_dead returns a count');
SELECT function_privs_are('outbox', 'replay_dead', ARRAY['text', 'timestamp with time zone'], 'public', '{}'::text[], 'PUBLIC cannot replay');
SELECT function_returns('outbox', 'discard', ARRAY['bigint'], 'boolean', 'discard(event_id) returns boolean');
SELECT is(
    (SELECT proargnames FROM pg_proc WHERE oid = 'outbox.discard(bigint)'::regprocedure),
    ARRAY['event_id'], 'discard parameter name, replay''s');
SELECT is_definer('outbox', 'discard', ARRAY['bigint'], 'discard runs with the owner''s rights');
SELECT function_privs_are('outbox', 'discard', ARRAY['bigint'], 'public', '{}'::text[], 'PUBLIC cannot discard');
SELECT function_returns('outbox', 'discard_dead', ARRAY['text', 'timestamp with time zone'], 'bigint', 'discard_dead returns a count');
SELECT is(
    (SELECT proargnames FROM pg_proc WHERE oid = 'outbox.discard_dead(text,timestamptz)'::regprocedure),
    ARRAY['biz_type', 'since'], 'discard_dead parameter names, replay_dead''s');
SELECT function_privs_are('outbox', 'discard_dead', ARRAY['text', 'timestamp with time zone'], 'public', '{}'::text[], 'PUBLIC cannot discard in bulk');
SELECT throws_ok($$SELECT outbox.discard(NULL)$$, '22004', 'event_id must not be null', 'null event_id to discard: 22004');
SELECT function_returns('outbox', 'resend', ARRAY['timestamp with time zone'], 'bigint', 'resend(since) returns a count');
SELECT is_definer('outbox', 'resend', ARRAY['timestamp with time zone'], 'resend runs with the owner''s rights');
SELECT function_privs_are('outbox', 'resend', ARRAY['timestamp with time zone'], 'public', '{}'::text[], 'PUBLIC cannot resend');

-- pg_dump keeps the relay's cursor and pause state, and a restore folds
-- them into the rows CREATE EXTENSION made.
SELECT is(
    (SELECT array_agg(c::regclass::text ORDER BY c::regclass::text)
       FROM pg_extension e, unnest(e.extconfig) c WHERE e.extname = 'outbox'),
    ARRAY['outbox.consumer_dedup', 'outbox.event_id_seq', 'outbox.event_log', 'outbox.event_state',
          'outbox.relay_control', 'outbox.relay_cursor'], 'pg_dump keeps events, claims, cursor and pause state');
SELECT trigger_is('outbox', 'relay_cursor', 'relay_cursor_restore', 'outbox', '_relay_cursor_restore', 'a restored cursor rebases the restored events');
SELECT trigger_is('outbox', 'relay_control', 'relay_control_restore', 'outbox', '_relay_control_restore', 'a restored pause state replaces the default');

SELECT * FROM finish();
ROLLBACK;
