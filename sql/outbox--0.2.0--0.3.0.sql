-- outbox 0.2.0 -> 0.3.0.  The schema this gives must equal a fresh 0.3.0
-- install (sql/upgrade.sql compares them); see outbox--0.3.0.sql for why
-- each object is as it is.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.3.0'" to load this file. \quit

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

-- An update keeps what users attached to outbox's objects: it replaces
-- views with CREATE OR REPLACE (grants, comments and dependent views
-- stay) and sets a comment only where the shipped one still stands.  What
-- it must drop: column relay_cursor.window_max_id, and consumer_dedup's
-- two unique constraints (rebuilt with source).  Another object built on
-- them (a view on the column, a foreign key on a constraint's index)
-- would make the drop fail with PostgreSQL's own "use DROP ... CASCADE",
-- which no ALTER EXTENSION can take: refuse first, naming each.  A view's
-- dependency is its rewrite rule's; outbox's own views are left out.
DO LANGUAGE plpgsql $dependents$
DECLARE
    ext        pg_catalog.oid;
    dependents pg_catalog.text;
BEGIN
    SELECT e.oid INTO ext FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'outbox';

    SELECT pg_catalog.string_agg(x.line, '; ' ORDER BY x.line) INTO dependents FROM (
    SELECT pg_catalog.format('%s depends on %s',
               COALESCE('view ' OPERATOR(pg_catalog.||) r.ev_class::pg_catalog.regclass::pg_catalog.text,
                        pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid)),
               pg_catalog.pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid)) AS line
      FROM pg_catalog.pg_depend d
      LEFT JOIN pg_catalog.pg_rewrite r
        ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass
       AND r.oid OPERATOR(pg_catalog.=) d.objid
     WHERE d.deptype OPERATOR(pg_catalog.=) 'n'
       AND ((d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
             AND d.refobjid OPERATOR(pg_catalog.=) 'outbox.relay_cursor'::pg_catalog.regclass
             AND d.refobjsubid OPERATOR(pg_catalog.=) (
                 SELECT a.attnum FROM pg_catalog.pg_attribute a
                  WHERE a.attrelid OPERATOR(pg_catalog.=) 'outbox.relay_cursor'::pg_catalog.regclass
                    AND a.attname OPERATOR(pg_catalog.=) 'window_max_id'))
         OR (d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
             AND d.refobjid OPERATOR(pg_catalog.=) ANY (ARRAY[
                 'outbox.consumer_dedup_pkey'::pg_catalog.regclass,
                 'outbox.consumer_dedup_biz_key'::pg_catalog.regclass]))
         OR (d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_constraint'::pg_catalog.regclass
             AND d.refobjid OPERATOR(pg_catalog.=) ANY (ARRAY(
                 SELECT c.oid FROM pg_catalog.pg_constraint c
                  WHERE c.conrelid OPERATOR(pg_catalog.=) 'outbox.consumer_dedup'::pg_catalog.regclass
                    AND c.conname OPERATOR(pg_catalog.=) ANY (ARRAY['consumer_dedup_pkey',
                                                                    'consumer_dedup_biz_key'])))))
       AND NOT EXISTS (
           SELECT FROM pg_catalog.pg_depend m
            WHERE m.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
              AND m.objid OPERATOR(pg_catalog.=) r.ev_class
              AND m.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
              AND m.refobjid OPERATOR(pg_catalog.=) ext
              AND m.deptype OPERATOR(pg_catalog.=) 'e')) x;

    IF dependents IS NULL THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'cannot update extension "outbox" because other objects depend on what the update drops'
        USING ERRCODE = 'dependent_objects_still_exist',
              DETAIL = pg_catalog.format('The update to 0.3.0 drops column window_max_id of table '
                  'outbox.relay_cursor and replaces the unique constraints consumer_dedup_pkey and '
                  'consumer_dedup_biz_key of table outbox.consumer_dedup: %s.', dependents),
              HINT = 'Save the definitions of these objects, drop them, run ALTER EXTENSION outbox '
                     'UPDATE again, then create them again: without window_max_id (the relay no '
                     'longer keeps it), and a foreign key on consumer_dedup with its new key '
                     '(consumer, event_id, source).';
END
$dependents$;

-- The relay reads a window in (tx, id) order, as an ordered index range.
DROP INDEX outbox.event_log_tx;
CREATE INDEX event_log_tx_id ON outbox.event_log (tx, id);

-- Events in flight one by one ('sending') hold their keys back too.
DROP INDEX outbox.event_state_pending;
CREATE INDEX event_state_unsent ON outbox.event_state (id)
    WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['new', 'sending']);

-- outbox.stats walks event_log in created_at order, skipping relayed
-- events by tx inside the index: a btree (created_at, tx) replaces the
-- BRIN on created_at, which only retention used.  It is built over every
-- kept event, under a lock that makes enqueue wait until the update
-- commits.
-- The index keeps its name: a comment on it is carried over.
DO LANGUAGE plpgsql $created_at$
DECLARE
    comment pg_catalog.text := pg_catalog.obj_description(
        'outbox.event_log_created_at'::pg_catalog.regclass, 'pg_class');
BEGIN
    DROP INDEX outbox.event_log_created_at;
    CREATE INDEX event_log_created_at ON outbox.event_log (created_at, tx);
    IF comment IS NOT NULL THEN
        EXECUTE pg_catalog.format('COMMENT ON INDEX outbox.event_log_created_at IS %L', comment);
    END IF;
END
$created_at$;

-- The open window's progress becomes a place in (tx, id) order.  0.2.0
-- recorded it as "every id <= window_last_id": the new place is the
-- longest (tx, id) prefix of the window whose events all have such ids,
-- so nothing unsent counts as sent; the few relayed events past it are
-- sent again (duplicates, never a loss).
ALTER TABLE outbox.relay_cursor ADD COLUMN window_last_tx pg_catalog.xid8 NOT NULL DEFAULT '0';
-- The source every message names (outbox_source), and exactly_once's
-- identity (src/sender.c), chosen by the relay's first start.
ALTER TABLE outbox.relay_cursor ADD COLUMN source uuid NOT NULL DEFAULT pg_catalog.gen_random_uuid(),
                                ADD COLUMN sender bigint NOT NULL DEFAULT 0,
                                ADD COLUMN sender_place text,
                                ADD COLUMN sender_timeline integer,
                                ADD COLUMN sender_system text,
                                ADD COLUMN proof text,
                                ADD COLUMN proof_seen text;
WITH c AS (
    SELECT * FROM outbox.relay_cursor WHERE window_snapshot IS NOT NULL
), w AS (
    SELECT l.tx, l.id, l.id OPERATOR(pg_catalog.<=) c.window_last_id AS relayed
      FROM outbox.event_log l, c
     WHERE pg_catalog.pg_visible_in_snapshot(l.tx, c.window_snapshot)
       AND NOT pg_catalog.pg_visible_in_snapshot(l.tx, c.done_snapshot)
       AND NOT EXISTS (SELECT 1 FROM outbox.event_state s
                        WHERE s.id OPERATOR(pg_catalog.=) l.id)
), first_unrelayed AS (
    SELECT tx, id FROM w WHERE NOT relayed ORDER BY tx, id LIMIT 1
), place AS (
    SELECT w.tx, w.id FROM w
     WHERE NOT EXISTS (SELECT 1 FROM first_unrelayed)
        OR ROW(w.tx, w.id) OPERATOR(pg_catalog.<)
           ROW((SELECT tx FROM first_unrelayed), (SELECT id FROM first_unrelayed))
     ORDER BY w.tx DESC, w.id DESC LIMIT 1
)
UPDATE outbox.relay_cursor r
   SET window_last_tx = COALESCE((SELECT tx FROM place), '0'),
       window_last_id = COALESCE((SELECT id FROM place), 0)
 WHERE r.window_snapshot IS NOT NULL;
-- 0.2.0's outbox.stats reads every column of the cursor (SELECT *), so
-- window_max_id goes once the view no longer reads it.  Replaced, not
-- dropped and made again: its columns only grow at the end (relay_state),
-- so the grants on it (the exporter's, the operator's), its comment and
-- the views built on it stay.
CREATE OR REPLACE VIEW outbox.stats AS
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

ALTER TABLE outbox.relay_cursor DROP COLUMN window_max_id;

-- The new comments, where the old version's still stand: a user's own
-- comment stays.
DO LANGUAGE plpgsql $comments$
BEGIN
    IF pg_catalog.obj_description('outbox.stats'::pg_catalog.regclass, 'pg_class')
       OPERATOR(pg_catalog.=)
       'Backlog, age of the oldest unsent event, dead letters and the last minute''s deliveries, in one row.'
    THEN
        COMMENT ON VIEW outbox.stats IS
            'Backlog, age of the oldest unsent event, dead letters and the last minute''s deliveries, in one row. backlog is exact up to 10,000 events committed since the relay''s last snapshot, estimated above that as the first 10,001 counted plus the ids after the last of them (ids of rolled-back or uncommitted enqueues count too); max_delay_sec, dead and retrying are exact. relay_state is this database''s relay''s state from relay_status(), ''waiting for a relay slot'' when it has none for want of slots, NULL when no relay is known.';
    END IF;
    IF pg_catalog.obj_description('outbox.relay_status()'::pg_catalog.regprocedure, 'pg_proc')
       OPERATOR(pg_catalog.=)
       'One row per running relay, from shared memory: state, broker, last error, totals since start.'
    THEN
        COMMENT ON FUNCTION outbox.relay_status() IS
            'One row per running relay, from shared memory: state, broker, last error, totals since start; then one per database left without a relay (pid NULL, state ''waiting for a relay slot'' or ''waiting for lock'').';
    END IF;
END
$comments$;

-- enqueue_bytes: a payload of bytes, sent as they are.  Adding the CHECK
-- reads event_log once (retention keeps it to the events kept).
ALTER TABLE outbox.event_log
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN payload_bytes bytea,
    ADD CONSTRAINT event_log_one_payload
        CHECK ((payload IS NULL) OPERATOR(pg_catalog.<>) (payload_bytes IS NULL));

-- Each event's incarnation (src/incarnation.c).  Those kept from before
-- have 0 and keep the outbox_source they had; the constant default makes
-- the column without rewriting the table, the function's takes over for
-- new rows.
CREATE FUNCTION outbox._incarnation() RETURNS bigint
LANGUAGE C VOLATILE PARALLEL RESTRICTED
AS 'MODULE_PATHNAME', 'outbox_incarnation';
REVOKE ALL ON FUNCTION outbox._incarnation() FROM PUBLIC;
ALTER TABLE outbox.event_log ADD COLUMN incarnation bigint NOT NULL DEFAULT 0;
ALTER TABLE outbox.event_log ALTER COLUMN incarnation SET DEFAULT outbox._incarnation();

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
REVOKE ALL ON FUNCTION outbox.enqueue_bytes(text, text, bytea, text, jsonb, text) FROM PUBLIC;

CREATE OR REPLACE VIEW outbox.dead_letters AS
SELECT l.id, l.biz_type, l.biz_key, l.topic, l.msg_key, l.payload, l.headers,
       s.attempts, s.last_error, l.created_at, s.updated_at AS died_at,
       l.payload_bytes
  FROM outbox.event_state s
  JOIN outbox.event_log l ON l.id OPERATOR(pg_catalog.=) s.id
 WHERE s.status OPERATOR(pg_catalog.=) 'dead';

CREATE OR REPLACE VIEW outbox.events AS
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

CREATE OR REPLACE FUNCTION outbox._relay_cursor_restore() RETURNS trigger
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

-- Claims are per source (the outbox_source header): event ids and
-- business keys are unique within one database, not across several on
-- one topic.  Claims made before keep source '' and still refuse a
-- duplicate of any source (outbox_claim looks for them).  source last, as
-- in outbox--0.3.0.sql: a claim without one looks under every source.
--
-- Building the two keys reads and sorts every claim under the update's
-- ACCESS EXCLUSIVE lock on consumer_dedup: claims wait for it (28 to
-- 38 s for 10 million claims, docs/install.md).  An operator may build
-- them beforehand, while claims go on:
--   ALTER TABLE outbox.consumer_dedup ADD COLUMN source text NOT NULL DEFAULT '';
--   CREATE UNIQUE INDEX CONCURRENTLY consumer_dedup_source_pkey
--       ON outbox.consumer_dedup (consumer, event_id, source);
--   CREATE UNIQUE INDEX CONCURRENTLY consumer_dedup_source_biz_key
--       ON outbox.consumer_dedup (consumer, biz_type, biz_key, source);
-- (every claim until the update has source '', so the new keys hold
-- wherever the old ones do).  The update then adopts each index, renamed
-- to its constraint, instead of building it; anything else under those
-- names is refused, rather than taken for a key it does not enforce.
DO LANGUAGE plpgsql $keys$
DECLARE
    dedup  pg_catalog.regclass := 'outbox.consumer_dedup'::pg_catalog.regclass;
    source pg_catalog.text;
    keys   pg_catalog.text[] := ARRAY[
        'consumer_dedup_pkey', 'PRIMARY KEY', 'consumer_dedup_source_pkey', '(consumer, event_id, source)',
        'consumer_dedup_biz_key', 'UNIQUE', 'consumer_dedup_source_biz_key', '(consumer, biz_type, biz_key, source)'];
    def    pg_catalog.text;
    usable pg_catalog.bool;
    alter  pg_catalog.text := 'ALTER TABLE outbox.consumer_dedup DROP CONSTRAINT consumer_dedup_pkey, '
                              'DROP CONSTRAINT consumer_dedup_biz_key';
BEGIN
    SELECT pg_catalog.concat_ws(' ', pg_catalog.format_type(a.atttypid, a.atttypmod),
                                CASE WHEN a.attnotnull THEN 'NOT NULL' END,
                                'DEFAULT ' OPERATOR(pg_catalog.||) pg_catalog.pg_get_expr(d.adbin, d.adrelid),
                                CASE WHEN a.attcollation OPERATOR(pg_catalog.<>) 100 THEN 'COLLATE '
                                     OPERATOR(pg_catalog.||) a.attcollation::pg_catalog.regcollation::pg_catalog.text END)
      INTO source
      FROM pg_catalog.pg_attribute a
      LEFT JOIN pg_catalog.pg_attrdef d
        ON d.adrelid OPERATOR(pg_catalog.=) a.attrelid AND d.adnum OPERATOR(pg_catalog.=) a.attnum
     WHERE a.attrelid OPERATOR(pg_catalog.=) dedup AND a.attname OPERATOR(pg_catalog.=) 'source'
       AND NOT a.attisdropped;
    IF source IS NULL THEN
        ALTER TABLE outbox.consumer_dedup ADD COLUMN source text NOT NULL DEFAULT '';
    ELSIF source OPERATOR(pg_catalog.<>) 'text NOT NULL DEFAULT ''''::text' THEN
        RAISE EXCEPTION 'column "source" of table outbox.consumer_dedup is not the one this update makes'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = pg_catalog.format('It is %s; the update makes it text NOT NULL DEFAULT ''''.', source),
                  HINT = 'Drop the column (and any index on it), or make it as docs/install.md says, '
                         'and run ALTER EXTENSION outbox UPDATE again.';
    END IF;

    FOR k IN 0..1 LOOP
        -- The index's definition after its name: its method, columns,
        -- collations, operator classes, order, INCLUDE and WHERE.
        SELECT pg_catalog.substring(pg_catalog.pg_get_indexdef(i.indexrelid), ' USING .*$'),
               i.indisunique AND i.indisvalid AND i.indisready AND i.indislive
               AND i.indrelid OPERATOR(pg_catalog.=) dedup
          INTO def, usable
          FROM pg_catalog.pg_index i
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.indexrelid
         WHERE c.relnamespace OPERATOR(pg_catalog.=) 'outbox'::pg_catalog.regnamespace
           AND c.relname OPERATOR(pg_catalog.=) keys[4 * k + 3];
        IF NOT FOUND THEN
            alter := pg_catalog.format('%s, ADD CONSTRAINT %I %s %s', alter,
                                       keys[4 * k + 1], keys[4 * k + 2], keys[4 * k + 4]);
        ELSIF usable AND def OPERATOR(pg_catalog.=) (' USING btree ' OPERATOR(pg_catalog.||) keys[4 * k + 4]) THEN
            alter := pg_catalog.format('%s, ADD CONSTRAINT %I %s USING INDEX %I', alter,
                                       keys[4 * k + 1], keys[4 * k + 2], keys[4 * k + 3]);
        ELSE
            RAISE EXCEPTION 'index outbox.% is not a key this update can adopt', keys[4 * k + 3]
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = pg_catalog.format('The update adopts a valid unique index on '
                          'outbox.consumer_dedup, btree %s; this one is %s%s.', keys[4 * k + 4],
                          CASE WHEN usable THEN '' ELSE 'not unique, not valid (a CREATE INDEX '
                              'CONCURRENTLY that failed) or on another table: ' END,
                          pg_catalog.substring(def, 8)),
                      HINT = pg_catalog.format('Drop it (DROP INDEX CONCURRENTLY outbox.%I) and build it '
                          'again as docs/install.md says, or leave it dropped and the update builds the key.',
                          keys[4 * k + 3]);
        END IF;
    END LOOP;
    EXECUTE alter;
END
$keys$;

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

REVOKE ALL ON FUNCTION outbox.claim(text, bigint, text, text, text) FROM PUBLIC;

-- Replay's order, said where an operator reads it; discard and
-- discard_dead, for dead letters nobody will replay.  As above, only
-- where the old version's comment still stands.
DO LANGUAGE plpgsql $comments$
BEGIN
    IF pg_catalog.obj_description('outbox.replay(bigint)'::pg_catalog.regprocedure, 'pg_proc')
       OPERATOR(pg_catalog.=)
       'Send a dead event again, with attempts reset and the same id; false if it is not dead.'
    THEN
        COMMENT ON FUNCTION outbox.replay(bigint) IS
            'Send a dead event again, with attempts reset and the same id; false if it is not dead. It reaches Kafka after the events of its key sent while it was dead, before those not sent yet.';
    END IF;
    IF pg_catalog.obj_description('outbox.replay_dead(text, timestamptz)'::pg_catalog.regprocedure, 'pg_proc')
       OPERATOR(pg_catalog.=)
       'Send again every dead event (of biz_type, dead since since); returns how many.'
    THEN
        COMMENT ON FUNCTION outbox.replay_dead(text, timestamptz) IS
            'Send again every dead event (of biz_type, dead since since), each as replay() does; returns how many.';
    END IF;
    IF pg_catalog.obj_description('outbox.dead_letters'::pg_catalog.regclass, 'pg_class')
       OPERATOR(pg_catalog.=)
       'Events the broker refused outbox.max_attempts times; outbox.replay() sends them again.'
    THEN
        COMMENT ON VIEW outbox.dead_letters IS
            'Events the broker refused outbox.max_attempts times; outbox.replay() sends them again, outbox.discard() removes them.';
    END IF;
END
$comments$;

-- discard and discard_dead: see outbox--0.3.0.sql for why each is as it is.
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

REVOKE ALL ON FUNCTION outbox.discard(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.discard_dead(text, timestamptz) FROM PUBLIC;
