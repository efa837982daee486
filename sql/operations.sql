-- Operations: stats, dead letters, replay and discard, pause and resume, retention,
-- and who may use them.  No relay runs here: delivery states are set by
-- hand, as the relay would set them.

CREATE FUNCTION pg_temp.mark_all_sent() RETURNS void LANGUAGE sql AS $$
    UPDATE outbox.relay_cursor SET done_snapshot = pg_current_snapshot(),
           window_snapshot = NULL, window_last_tx = '0', window_last_id = 0;
$$;

TRUNCATE outbox.event_log, outbox.event_state, outbox.consumer_dedup;
SELECT pg_temp.mark_all_sent();

-- Nothing enqueued: all figures zero; no relay runs without preloading.
SELECT * FROM outbox.stats;
SELECT count(*) AS relays FROM outbox.relay_status();

-- Three events wait; the oldest sets max_delay_sec.
SELECT count(outbox.enqueue('OrderCreated', 'ops-' || i, '{}', topic => 'ops')) FROM generate_series(1, 3) i;
UPDATE outbox.event_log SET created_at = now() - interval '90 seconds' WHERE biz_key = 'ops-1';
SELECT backlog, max_delay_sec BETWEEN 90 AND 100 AS delay_from_oldest, dead, retrying FROM outbox.stats;

-- Sent: the backlog is gone.
SELECT pg_temp.mark_all_sent();
SELECT backlog, max_delay_sec, dead FROM outbox.stats;

-- One waiting for a retry, one dead: as the relay records them.
INSERT INTO outbox.event_state (id, status, attempts, next_attempt_at, last_error)
SELECT id, 'new', 2, now() + interval '1 minute', 'Broker: Request timed out'
  FROM outbox.event_log WHERE biz_key = 'ops-2';
INSERT INTO outbox.event_state (id, status, attempts, last_error, updated_at)
SELECT id, 'dead', 10, 'Broker: Message size too large', now() - interval '1 hour'
  FROM outbox.event_log WHERE biz_key = 'ops-3';
SELECT backlog, dead, retrying FROM outbox.stats;
SELECT biz_key, attempts, last_error FROM outbox.dead_letters;
SELECT biz_key, status, attempts FROM outbox.events ORDER BY biz_key;

-- replay: a dead event goes back to new with attempts reset, same id.
SELECT id AS dead_id FROM outbox.dead_letters \gset
SELECT outbox.replay(:dead_id) AS replayed;
SELECT id = :dead_id AS same_id, status, attempts, last_error FROM outbox.events WHERE biz_key = 'ops-3';
SELECT outbox.replay(:dead_id) AS replayed_again;
SELECT outbox.replay(-1) AS replayed_unknown;
SELECT err($$SELECT outbox.replay(NULL)$$);

-- replay_dead: in bulk, by biz_type and by time of death.
UPDATE outbox.event_state SET status = 'dead', updated_at = now() - interval '1 hour';
SELECT outbox.replay_dead(biz_type => 'NoSuchType') AS none_of_that_type;
SELECT outbox.replay_dead(since => now() - interval '10 minutes') AS none_died_recently;
SELECT outbox.replay_dead('OrderCreated') AS replayed;
SELECT count(*) AS still_dead FROM outbox.dead_letters;

-- pause and resume: a flag the relay reads, kept in a table.
SELECT outbox.pause();
SELECT paused, changed_by = session_user AS by_me FROM outbox.relay_control;
SELECT outbox.resume();
SELECT paused FROM outbox.relay_control;

-- Retention: old sent events and old claims go; recent ones, waiting and
-- dead ones stay.
DELETE FROM outbox.event_state;
SELECT count(outbox.enqueue('Old', 'old-' || i, '{}', topic => 'ops')) FROM generate_series(1, 5) i;
SELECT count(outbox.enqueue('Unsent', 'unsent-early', '{}', topic => 'ops'));
SELECT count(outbox.enqueue('Recent', 'recent-' || i, '{}', topic => 'ops')) FROM generate_series(1, 2) i;
UPDATE outbox.event_log SET created_at = now() - interval '2 hours'
 WHERE biz_type IN ('Old', 'OrderCreated') OR biz_key = 'unsent-early';
SELECT pg_temp.mark_all_sent();
-- unsent-early's transaction was still open when the relay last looked (a
-- long transaction): old, below every young id, so only the relay's
-- progress keeps it from the purge.
UPDATE outbox.relay_cursor c
   SET done_snapshot = (l.tx || ':' || pg_snapshot_xmax(c.done_snapshot) || ':' || l.tx)::pg_snapshot
  FROM outbox.event_log l WHERE l.biz_key = 'unsent-early';
INSERT INTO outbox.event_state (id, status, attempts) SELECT id, 'dead', 10 FROM outbox.event_log WHERE biz_key = 'old-1';
INSERT INTO outbox.event_state (id, status, attempts) SELECT id, 'new', 1 FROM outbox.event_log WHERE biz_key = 'old-2';
INSERT INTO outbox.event_state (id, status, attempts) SELECT id, 'sent', 1 FROM outbox.event_log WHERE biz_key = 'old-3';
SELECT count(outbox.enqueue('Unsent', 'unsent-1', '{}', topic => 'ops'));
UPDATE outbox.event_log SET created_at = now() - interval '2 hours' WHERE biz_key = 'unsent-1';
SELECT outbox.claim('inventory', 1), outbox.claim('inventory', 2);
UPDATE outbox.consumer_dedup SET processed_at = now() - interval '8 days' WHERE event_id = 1;
SELECT outbox._purge(interval '1 hour', interval '7 days', 2) AS removed_first_round;
SELECT outbox._purge(interval '1 hour', interval '7 days', 1000) AS removed_second_round;
SELECT outbox._purge(interval '1 hour', interval '7 days', 1000) AS removed_third_round;
SELECT biz_key FROM outbox.event_log ORDER BY biz_key;
SELECT count(*) AS state_rows_of_removed FROM outbox.event_state s
 WHERE NOT EXISTS (SELECT 1 FROM outbox.event_log l WHERE l.id = s.id);
SELECT event_id FROM outbox.consumer_dedup;

-- Only an operator may look, pause, resume, replay or discard.
CREATE ROLE outbox_ops_nobody;
CREATE ROLE outbox_ops_operator;
GRANT USAGE ON SCHEMA outbox TO outbox_ops_nobody, outbox_ops_operator;
GRANT SELECT ON outbox.stats, outbox.dead_letters, outbox.events TO outbox_ops_operator;
GRANT EXECUTE ON FUNCTION outbox.relay_status(), outbox.pause(), outbox.resume(),
      outbox.replay(bigint), outbox.replay_dead(text, timestamptz),
      outbox.discard(bigint), outbox.discard_dead(text, timestamptz) TO outbox_ops_operator;
SET ROLE outbox_ops_nobody;
SELECT err($$SELECT outbox.pause()$$);
SELECT err($$SELECT outbox.resume()$$);
SELECT err($$SELECT outbox.replay(1)$$);
SELECT err($$SELECT outbox.replay_dead()$$);
SELECT err($$SELECT outbox.discard(1)$$);
SELECT err($$SELECT outbox.discard_dead()$$);
SELECT err($$SELECT * FROM outbox.stats$$);
SELECT err($$SELECT * FROM outbox.relay_status()$$);
SELECT err($$SELECT * FROM outbox.dead_letters$$);
SELECT err($$SELECT outbox._purge(interval '1 hour', interval '1 hour', 1)$$);
SELECT err($$UPDATE outbox.relay_control SET paused = true$$);
RESET ROLE;
SET ROLE outbox_ops_operator;
SELECT outbox.pause();
SELECT outbox.resume();
SELECT outbox.replay_dead() AS replayed;
SELECT outbox.discard(-1) AS discarded, outbox.discard_dead() AS discarded_in_bulk;
SELECT backlog >= 0 AS stats_readable FROM outbox.stats;
SELECT count(*) AS dead FROM outbox.dead_letters;
SELECT err($$SELECT outbox._purge(interval '1 hour', interval '1 hour', 1)$$);
SELECT err($$UPDATE outbox.relay_control SET paused = true$$);
RESET ROLE;
DROP OWNED BY outbox_ops_nobody, outbox_ops_operator;
DROP ROLE outbox_ops_nobody, outbox_ops_operator;

-- The retry path's unfinished events are 'new' or 'sending' (the relay
-- hands it the in-flight events of a stuck topic): both are unsent for
-- stats (both count as retrying: a stuck topic's events wait visibly),
-- outbox.events shows them, retention keeps them and replay leaves them
-- alone (it is for dead events).
TRUNCATE outbox.event_log, outbox.event_state;
SELECT count(outbox.enqueue('Stuck', 'stuck-' || i, '{}', topic => 'stuck')) FROM generate_series(1, 3) i;
UPDATE outbox.event_log SET created_at = now() - interval '2 hours' WHERE biz_key = 'stuck-1';
SELECT pg_temp.mark_all_sent();
INSERT INTO outbox.event_state (id, status, attempts, last_error)
SELECT id, 'sending', 1, 'Broker: Topic authorization failed' FROM outbox.event_log WHERE biz_key = 'stuck-1';
INSERT INTO outbox.event_state (id, status, attempts)
SELECT id, 'sending', 0 FROM outbox.event_log WHERE biz_key = 'stuck-2';
SELECT backlog, max_delay_sec BETWEEN 7200 AND 7260 AS delay_from_sending, dead, retrying FROM outbox.stats;
SELECT biz_key, status, attempts FROM outbox.events ORDER BY biz_key;
SELECT outbox.replay(id) AS replayed_sending FROM outbox.event_log WHERE biz_key = 'stuck-1';
SELECT outbox._purge(interval '1 hour', interval '7 days', 1000) AS removed;
SELECT biz_key FROM outbox.event_log ORDER BY biz_key;

-- Unrelayed is read from done_snapshot's xmax and in-progress list, PgQ
-- style.  An event whose transaction was running when the relay took its
-- snapshot (listed in xip) counts, and sets max_delay_sec; events of
-- transactions that committed before it do not, however old the
-- snapshot's xmin.
TRUNCATE outbox.event_log, outbox.event_state;
SELECT count(outbox.enqueue('Open', 'open-early', '{}', topic => 'ops'));
UPDATE outbox.event_log SET created_at = now() - interval '3 hours';
SELECT count(outbox.enqueue('Sent', 'sent-' || i, '{}', topic => 'ops')) FROM generate_series(1, 5) i;
UPDATE outbox.relay_cursor c
   SET done_snapshot = (l.tx || ':' || pg_snapshot_xmax(pg_current_snapshot()) || ':' || l.tx)::pg_snapshot
  FROM outbox.event_log l WHERE l.biz_key = 'open-early';
SELECT count(outbox.enqueue('Fresh', 'fresh-1', '{}', topic => 'ops'));
SELECT backlog, max_delay_sec BETWEEN 10800 AND 10860 AS delay_from_open, retrying FROM outbox.stats;
SELECT biz_key, status FROM outbox.events ORDER BY biz_key;

-- max_delay_sec is exact however large the backlog.  created_at is the
-- enqueuing transaction's start, so a transaction that started early and
-- took its xid late enqueues the oldest event with the highest tx and id:
-- here 'late' (created two hours ago) behind 10,010 younger fresh events,
-- more than stats counts one by one, above relayed events older still.
TRUNCATE outbox.event_log, outbox.event_state;
SELECT count(outbox.enqueue('Old', 'old-' || i, '{}', topic => 'ops')) FROM generate_series(1, 50) i;
UPDATE outbox.event_log SET created_at = now() - interval '5 hours';
SELECT pg_temp.mark_all_sent();
SELECT count(outbox.enqueue('Young', 'young-' || i, '{}', topic => 'ops')) FROM generate_series(1, 10010) i;
SELECT count(outbox.enqueue('Late', 'late', '{}', topic => 'ops'));
UPDATE outbox.event_log SET created_at = now() - interval '2 hours' WHERE biz_key = 'late';
SELECT backlog, max_delay_sec BETWEEN 7200 AND 7260 AS delay_from_late FROM outbox.stats;
-- The relay has sent half of them in an open window ('late' among the
-- unsent): the same.  Then 'late' fails and waits for a retry: the same.
UPDATE outbox.relay_cursor
   SET window_snapshot = pg_current_snapshot(), (window_last_tx, window_last_id) =
       (SELECT tx, id FROM outbox.event_log WHERE biz_type = 'Young' ORDER BY tx, id OFFSET 5000 LIMIT 1);
SELECT backlog, max_delay_sec BETWEEN 7200 AND 7260 AS delay_from_late FROM outbox.stats;
INSERT INTO outbox.event_state (id, status, attempts) SELECT id, 'new', 1 FROM outbox.event_log WHERE biz_key = 'late';
SELECT backlog, max_delay_sec BETWEEN 7200 AND 7260 AS delay_from_late, retrying FROM outbox.stats;
-- Dead, it no longer counts: the oldest unsent is a young one.
UPDATE outbox.event_state SET status = 'dead';
SELECT backlog, max_delay_sec < 600 AS delay_from_young, dead, retrying FROM outbox.stats;

-- discard: a dead event goes for good, with its state row, and its
-- business key is free again.  Kept, it answers a retried enqueue with its
-- own dead id, so nothing is sent; discarded, the same enqueue makes a new
-- event, unsent ('new'), which the relay sends by the window path.  Only a
-- dead event: any other is left alone and the answer is false, as
-- replay's.
TRUNCATE outbox.event_log, outbox.event_state;
SELECT count(outbox.enqueue('Discard', 'd-' || i, jsonb_build_object('v', i), topic => 'ops', msg_key => 'K'))
  FROM generate_series(1, 5) i;
SELECT pg_temp.mark_all_sent();
-- d-1 dead, d-2 waiting for a retry, d-3 in flight one by one, d-4 sent
-- on a retry, d-5 sent at once (no state row).
INSERT INTO outbox.event_state (id, status, attempts, last_error)
SELECT id, CASE biz_key WHEN 'd-1' THEN 'dead' WHEN 'd-2' THEN 'new' WHEN 'd-3' THEN 'sending' ELSE 'sent' END,
       3, 'Broker: Message size too large'
  FROM outbox.event_log WHERE biz_key IN ('d-1', 'd-2', 'd-3', 'd-4');
SELECT id AS dead_id FROM outbox.dead_letters \gset
SELECT outbox.enqueue('Discard', 'd-1', '{"v": 1}', topic => 'ops', msg_key => 'K') = :dead_id AS enqueue_gets_dead_id;
SELECT dead, backlog FROM outbox.stats;

SELECT outbox.discard(id) AS discarded_not_dead, biz_key, status
  FROM outbox.events WHERE biz_key <> 'd-1' ORDER BY biz_key;
SELECT outbox.discard(:dead_id) AS discarded;
SELECT (SELECT count(*) FROM outbox.event_log WHERE id = :dead_id) AS event_rows,
       (SELECT count(*) FROM outbox.event_state WHERE id = :dead_id) AS state_rows,
       (SELECT count(*) FROM outbox.dead_letters) AS dead_letters;
SELECT dead, backlog FROM outbox.stats;
SELECT outbox.discard(:dead_id) AS discarded_again;
SELECT outbox.discard(-1) AS discarded_unknown;
SELECT err($$SELECT outbox.discard(NULL)$$);

-- The key is free: a new event, unsent, counted in the backlog.
SELECT outbox.enqueue('Discard', 'd-1', '{"v": 1}', topic => 'ops', msg_key => 'K') AS new_id \gset
SELECT :new_id > :dead_id AS new_id, status, attempts, last_error FROM outbox.events WHERE biz_key = 'd-1';
SELECT dead, backlog FROM outbox.stats;
SELECT biz_key, status FROM outbox.events ORDER BY biz_key;

-- Rolled back, a discard leaves the event dead, its key taken.
INSERT INTO outbox.event_state (id, status, attempts, updated_at) VALUES (:new_id, 'dead', 3, now() - interval '1 hour');
BEGIN;
SELECT outbox.discard(:new_id) AS discarded;
ROLLBACK;
SELECT outbox.enqueue('Discard', 'd-1', '{"v": 1}', topic => 'ops', msg_key => 'K') = :new_id AS key_still_taken;

-- Each discard leaves one LOG line naming the event (its DETAIL names its
-- keys, attempts, last error and the session's role).
INSERT INTO outbox.event_log (id, biz_type, biz_key, topic, msg_key, payload)
VALUES (990001, 'Discard', 'logged', 'ops.logged', 'L', '{}');
INSERT INTO outbox.event_state (id, status, attempts, last_error) VALUES (990001, 'dead', 10, 'Broker: Invalid record');
\set VERBOSITY terse
SET client_min_messages = log;
SELECT outbox.discard(990001) AS discarded;
RESET client_min_messages;
\set VERBOSITY default

-- discard_dead: in bulk, by biz_type and by time of death, as replay_dead.
SELECT count(outbox.enqueue('Bulk', 'b-' || i, '{}', topic => 'ops')) FROM generate_series(1, 3) i;
INSERT INTO outbox.event_state (id, status, attempts, updated_at)
SELECT id, 'dead', 3, now() - interval '1 hour' FROM outbox.event_log WHERE biz_type = 'Bulk';
UPDATE outbox.event_state SET updated_at = now() WHERE id = (SELECT id FROM outbox.event_log WHERE biz_key = 'b-3');
SELECT outbox.discard_dead(biz_type => 'NoSuchType') AS none_of_that_type;
SELECT outbox.discard_dead(since => now() - interval '10 minutes') AS died_recently;
SELECT outbox.discard_dead('Bulk') AS discarded;
SELECT outbox.discard_dead() AS discarded_the_rest;
SELECT biz_type, count(*) FROM outbox.event_log GROUP BY 1 ORDER BY 1;
SELECT count(*) AS dead_letters FROM outbox.dead_letters;

-- A role granted discard (and only that) may discard; one without gets
-- 42501.
INSERT INTO outbox.event_state (id, status, attempts)
SELECT id, 'dead', 3 FROM outbox.event_log WHERE biz_key = 'd-5';
CREATE ROLE outbox_ops_discarder;
CREATE ROLE outbox_ops_other;
GRANT USAGE ON SCHEMA outbox TO outbox_ops_discarder, outbox_ops_other;
GRANT EXECUTE ON FUNCTION outbox.discard(bigint) TO outbox_ops_discarder;
SELECT id AS d5_id FROM outbox.event_log WHERE biz_key = 'd-5' \gset
SET ROLE outbox_ops_other;
SELECT err(format($$SELECT outbox.discard(%s)$$, :d5_id));
SELECT err($$SELECT outbox.discard_dead()$$);
RESET ROLE;
SET ROLE outbox_ops_discarder;
SELECT outbox.discard(:d5_id) AS discarded;
SELECT err($$DELETE FROM outbox.event_log$$);
RESET ROLE;
SELECT count(*) AS d5_rows FROM outbox.event_log WHERE biz_key = 'd-5';
DROP OWNED BY outbox_ops_discarder, outbox_ops_other;
DROP ROLE outbox_ops_discarder, outbox_ops_other;
