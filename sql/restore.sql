-- What a restore does with the relay's rows pg_dump keeps: the pause state
-- replaces the default one, and the restored cursor judges the restored
-- events, which get tx 2 (done) or the restoring transaction (to send).
-- Then outbox.resend(), for a dump without the cursor.  All in one
-- transaction, rolled back: the rows CREATE EXTENSION made stay as they were.
BEGIN;
TRUNCATE outbox.event_log, outbox.event_state;

-- A second relay_control row is folded into the first.
INSERT INTO outbox.relay_control (paused, changed_by) VALUES (true, 'restored');
SELECT paused, changed_by FROM outbox.relay_control;

-- Events as the source had them (its xids, its cursor): done below 100 and
-- 150 running; window up to 300, relayed up to the id of 'window-sent'.
SELECT count(outbox.enqueue('T', k, '{}', topic => 'restore'))
  FROM unnest(ARRAY['done', 'window-sent', 'window-sending', 'after-window',
                    'done-dead', 'after-window-retrying']) k;
UPDATE outbox.event_log SET tx = CASE biz_key
    WHEN 'done' THEN '90' WHEN 'done-dead' THEN '91'
    WHEN 'window-sent' THEN '150' WHEN 'window-sending' THEN '151'
    ELSE '350' END::xid8;
INSERT INTO outbox.event_state (id, status, attempts)
SELECT id, CASE biz_key WHEN 'done-dead' THEN 'dead' ELSE 'new' END, 1
  FROM outbox.event_log WHERE biz_key IN ('done-dead', 'after-window-retrying');
INSERT INTO outbox.relay_cursor (done_snapshot, window_snapshot, window_last_tx, window_last_id)
SELECT '100:160:150,151', '300:300:', '150', id
  FROM outbox.event_log WHERE biz_key = 'window-sent';

-- One cursor row, the kept one; each event rebased by its status there.
SELECT count(*) AS cursors FROM outbox.relay_cursor;
SELECT biz_key, CASE tx WHEN '2' THEN 'done' WHEN pg_current_xact_id() THEN 'to send' ELSE tx::text END AS tx
  FROM outbox.event_log ORDER BY id;
SELECT biz_key, status FROM outbox.events ORDER BY id;

-- resend: every kept event created since, except dead ones, is sent again.
SELECT outbox.resend(now() - interval '1 minute') AS resent;
SELECT biz_key, status FROM outbox.events ORDER BY id;
SELECT count(*) AS states_left FROM outbox.event_state;
SELECT public.err($$SELECT outbox.resend(NULL)$$);
ROLLBACK;

-- The cursor CREATE EXTENSION makes inside the restoring transaction does
-- not list that transaction as running, and once a later xid has ended it
-- sees it as committed (here: a subtransaction's, rolled back).  The
-- rebase lists it, so the events it gives this xid count as unsent.
BEGIN;
SELECT pg_current_xact_id() IS NOT NULL AS have_xid;
SAVEPOINT later_xid;
CREATE TEMP TABLE later_xid ();
ROLLBACK TO later_xid;
SELECT pg_visible_in_snapshot(pg_current_xact_id(), pg_current_snapshot()) AS own_xid_looks_committed;
DELETE FROM outbox.relay_cursor;
INSERT INTO outbox.relay_cursor (done_snapshot) VALUES (pg_current_snapshot());
TRUNCATE outbox.event_log, outbox.event_state;
SELECT outbox.enqueue('T', 'unsent-in-source', '{}', topic => 'restore') IS NOT NULL AS enqueued;
INSERT INTO outbox.relay_cursor (done_snapshot) VALUES ('1:1:');
SELECT biz_key, status FROM outbox.events;
ROLLBACK;
