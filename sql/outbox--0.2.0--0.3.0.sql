-- outbox 0.2.0 -> 0.3.0.  The schema this gives must equal a fresh 0.3.0
-- install (sql/upgrade.sql compares them); see outbox--0.3.0.sql for why
-- each object is as it is.  It runs with events in flight: the relay's
-- progress (relay_cursor) and the delivery states are kept as they are.
-- The new btree on event_log (created_at, tx) is built over every kept
-- event, under a lock that makes enqueue wait until the update commits.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.3.0'" to load this file. \quit

-- CREATE EXTENSION adopts an existing schema named outbox (the control file
-- names it).  Whatever a non-superuser put there beforehand takes part in
-- name resolution here and in every function that runs with the owner's
-- rights: a database owner's outbox.nextval(text) was once bound to the id
-- default and ran as superuser at the first enqueue.  Refuse a schema a
-- non-superuser owns, may create objects in, or has filled: every object
-- in a schema depends on it in pg_depend, so one query finds them all.
-- Here outbox's own objects are there, and anything else is refused,
-- named.
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

-- The retry path's unfinished events are 'new' or, since 0.3.0, 'sending'
-- (in flight, e.g. of a stuck topic): one partial index for both.
DROP INDEX outbox.event_state_pending;
CREATE INDEX event_state_unsent ON outbox.event_state (id)
    WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['new', 'sending']);

-- outbox.stats walks event_log in created_at order, skipping relayed
-- events by tx inside the index: a btree (created_at, tx) replaces the
-- BRIN on created_at, which only retention used.
DROP INDEX outbox.event_log_created_at;
CREATE INDEX event_log_created_at ON outbox.event_log (created_at, tx);

-- Unsent: not yet relayed, or owned by the retry path and not finished
-- (event_state 'new' or 'sending').  Not yet relayed is read the way PgQ
-- reads a batch, from done_snapshot D: transactions that took their xid
-- after D (tx >= xmax(D), "fresh") plus those running at D (tx in
-- xip(D), "open"), minus the relayed part of the open window.  Never
-- "tx >= xmin(D)": that range holds every event since the oldest
-- transaction open at D, however long it stays open.
--
-- The cost stays bounded with a large backlog:
--   backlog  fresh events are counted up to 10,000 (a scan in tx order
--            that stops there); above, they are estimated from the id
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
CREATE OR REPLACE VIEW outbox.stats AS
WITH fresh AS MATERIALIZED (
    SELECT l.id, l.created_at
      FROM outbox.event_log l
     WHERE l.tx OPERATOR(pg_catalog.>=)
               (SELECT pg_catalog.pg_snapshot_xmax(c.done_snapshot) FROM outbox.relay_cursor c)
       AND NOT COALESCE(l.id OPERATOR(pg_catalog.<=) (SELECT c.window_last_id FROM outbox.relay_cursor c)
                        AND pg_catalog.pg_visible_in_snapshot(
                                l.tx, (SELECT c.window_snapshot FROM outbox.relay_cursor c)), false)
     ORDER BY l.tx
     LIMIT 10001
), fresh_sum AS (
    -- The retry path's events are left out after the LIMIT, so that the
    -- planner may join the two sets as their sizes say (a probe per event
    -- cost three times the scan).
    SELECT (SELECT pg_catalog.count(*) FROM fresh) AS n,
           (SELECT pg_catalog.min(id) FROM fresh) AS low_id,
           pg_catalog.count(*) AS unsent,
           pg_catalog.min(f.created_at) AS oldest
      FROM fresh f
     WHERE NOT EXISTS (SELECT FROM outbox.event_state s WHERE s.id OPERATOR(pg_catalog.=) f.id)
), open AS MATERIALIZED (
    SELECT l.created_at
      FROM outbox.event_log l
     WHERE l.tx OPERATOR(pg_catalog.=) ANY (ARRAY(
               SELECT pg_catalog.pg_snapshot_xip(c.done_snapshot) FROM outbox.relay_cursor c))
       AND NOT COALESCE(l.id OPERATOR(pg_catalog.<=) (SELECT c.window_last_id FROM outbox.relay_cursor c)
                        AND pg_catalog.pg_visible_in_snapshot(
                                l.tx, (SELECT c.window_snapshot FROM outbox.relay_cursor c)), false)
       AND NOT EXISTS (SELECT FROM outbox.event_state s WHERE s.id OPERATOR(pg_catalog.=) l.id)
), waiting AS MATERIALIZED (
    SELECT l.created_at, s.attempts
      FROM outbox.event_state s JOIN outbox.event_log l ON l.id OPERATOR(pg_catalog.=) s.id
     WHERE s.status OPERATOR(pg_catalog.=) ANY (ARRAY['new', 'sending'])
), relays AS (
    SELECT COALESCE(pg_catalog.sum(r.sent_last_minute), 0)::bigint AS sent,
           COALESCE(pg_catalog.sum(r.failed_last_minute), 0)::bigint AS failed
      FROM outbox.relay_status() r
)
SELECT CASE
           WHEN f.n OPERATOR(pg_catalog.<=) 10000 THEN f.unsent
           ELSE GREATEST(f.unsent, (SELECT pg_catalog.max(l.id) FROM outbox.event_log l)
                                  OPERATOR(pg_catalog.-) f.low_id OPERATOR(pg_catalog.+) 1)
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
                                         l.id OPERATOR(pg_catalog.<=)
                                             (SELECT c.window_last_id FROM outbox.relay_cursor c)
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
       (SELECT pg_catalog.count(*) FROM waiting WHERE attempts OPERATOR(pg_catalog.>) 0) AS retrying
  FROM fresh_sum f, relays;

COMMENT ON VIEW outbox.stats IS
    'Backlog, age of the oldest unsent event, dead letters and the last minute''s deliveries, in one row. backlog is exact up to 10,000 events committed since the relay''s last snapshot, estimated above that from their id range (ids of rolled-back or uncommitted enqueues count too); max_delay_sec, dead and retrying are exact.';
