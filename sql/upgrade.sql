-- 0.1.0 and 0.2.0 upgraded to the current version give the schema a fresh
-- install gives, from 0.2.0 also with consumer_dedup's keys built
-- beforehand; the upgrade refuses a schema holding objects that are not
-- outbox's; 0.2.0 upgrades with events in every state, which read the same
-- before and after.
\set regress_db :DBNAME
\set SHOW_CONTEXT never
CREATE DATABASE outbox_upgrade;
\c outbox_upgrade

-- schema_lines(): outbox's schema as text, one line per fact, by name
-- (oids differ between installs): what pg_dump -s would show of the
-- extension's members, plus what marks them as members and config.
SET check_function_bodies = off;
CREATE FUNCTION public.schema_lines() RETURNS SETOF text LANGUAGE sql AS $$
    SELECT 'schema ' || pg_get_userbyid(nspowner) || ' ' || COALESCE(nspacl::text, '')
      FROM pg_namespace WHERE nspname = 'outbox'
    UNION ALL
    SELECT format('relation %s %s %s %s %s', c.relname, c.relkind, pg_get_userbyid(c.relowner),
                  c.relacl, obj_description(c.oid, 'pg_class'))
      FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace
    UNION ALL
    SELECT format('column %s.%s %s %s %s %s %s', c.relname, a.attname,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  pg_get_expr(d.adbin, d.adrelid), a.attacl, col_description(c.oid, a.attnum))
      FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
      LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
     WHERE c.relnamespace = 'outbox'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT format('constraint %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
      FROM pg_constraint WHERE connamespace = 'outbox'::regnamespace
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(indexrelid)
      FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
     WHERE c.relnamespace = 'outbox'::regnamespace
    UNION ALL
    SELECT format('view %s %s', c.relname, pg_get_viewdef(c.oid))
      FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'v'
    UNION ALL
    SELECT format('sequence %s %s %s %s %s %s', s.seqrelid::regclass, s.seqtypid::regtype,
                  s.seqstart, s.seqincrement, s.seqmax, s.seqcache)
      FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
     WHERE c.relnamespace = 'outbox'::regnamespace
    UNION ALL
    SELECT format('function %s %s %s %s', pg_get_functiondef(p.oid), pg_get_userbyid(p.proowner),
                  p.proacl, obj_description(p.oid, 'pg_proc'))
      FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(t.oid)
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
     WHERE c.relnamespace = 'outbox'::regnamespace
    UNION ALL
    SELECT 'member ' || pg_describe_object(d.classid, d.objid, d.objsubid)
      FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname = 'outbox'
    UNION ALL
    SELECT format('config %s %s', cfg::regclass, cond)
      FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u(cfg, cond)
     WHERE e.extname = 'outbox'
$$;

-- 0.1.0 with some data, then the update (through 0.2.0).
CREATE EXTENSION outbox VERSION '0.1.0';
SELECT outbox.enqueue('T', 'before-update', '{}') IS NOT NULL AS enqueued;
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
CREATE TABLE upgraded AS SELECT * FROM schema_lines() AS line;

-- 0.2.0, then the update.
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '0.2.0';
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
CREATE TABLE upgraded_020 AS SELECT * FROM schema_lines() AS line;

-- 0.2.0 with consumer_dedup's new keys built beforehand, as docs/install.md
-- says, and a claim meanwhile: the update adopts the two indexes (the same
-- relations become the keys' indexes) instead of building them.
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '0.2.0';
ALTER TABLE outbox.consumer_dedup ADD COLUMN source text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX CONCURRENTLY consumer_dedup_source_pkey
    ON outbox.consumer_dedup (consumer, event_id, source);
CREATE UNIQUE INDEX CONCURRENTLY consumer_dedup_source_biz_key
    ON outbox.consumer_dedup (consumer, biz_type, biz_key, source);
SELECT outbox.claim('inventory', 7, 'T', 'k-7') AS first, outbox.claim('inventory', 7, 'T', 'k-7') AS again;
CREATE TABLE prebuilt AS
    SELECT oid FROM pg_class WHERE relname IN ('consumer_dedup_source_pkey', 'consumer_dedup_source_biz_key');
ALTER EXTENSION outbox UPDATE;
SELECT c.conname, pg_get_constraintdef(c.oid)
  FROM pg_constraint c JOIN prebuilt p ON p.oid = c.conindid ORDER BY 1;
SELECT outbox.claim('inventory', 7, 'T', 'k-7') AS again, outbox.claim('inventory', 7, 'T', 'k-7', 'db-2') AS other_source;
DELETE FROM outbox.consumer_dedup;
CREATE TABLE upgraded_prebuilt AS SELECT * FROM schema_lines() AS line;

-- An index under one of those names that is not the key is refused.
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '0.2.0';
ALTER TABLE outbox.consumer_dedup ADD COLUMN source text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX consumer_dedup_source_pkey ON outbox.consumer_dedup (consumer, source, event_id);
ALTER EXTENSION outbox UPDATE;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
DROP INDEX outbox.consumer_dedup_source_pkey;
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';

-- A fresh install of the current version in the same database.
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';

-- Lines only one of them has: none.
(SELECT 'only fresh: ' || line FROM schema_lines() AS line
 EXCEPT SELECT 'only fresh: ' || line FROM upgraded)
UNION ALL
(SELECT 'only upgraded: ' || line FROM upgraded
 EXCEPT SELECT 'only upgraded: ' || line FROM schema_lines() AS line)
ORDER BY 1;
SELECT count(*) > 50 AS compared_enough FROM upgraded;
(SELECT 'only fresh: ' || line FROM schema_lines() AS line
 EXCEPT SELECT 'only fresh: ' || line FROM upgraded_020)
UNION ALL
(SELECT 'only upgraded from 0.2.0: ' || line FROM upgraded_020
 EXCEPT SELECT 'only upgraded from 0.2.0: ' || line FROM schema_lines() AS line)
ORDER BY 1;
(SELECT 'only fresh: ' || line FROM schema_lines() AS line
 EXCEPT SELECT 'only fresh: ' || line FROM upgraded_prebuilt)
UNION ALL
(SELECT 'only upgraded with keys built beforehand: ' || line FROM upgraded_prebuilt
 EXCEPT SELECT 'only upgraded with keys built beforehand: ' || line FROM schema_lines() AS line)
ORDER BY 1;

-- 0.2.0 holding events in every state, as its relay leaves them: sent;
-- dead; waiting for a retry; in an open window, relayed or not; unsent,
-- the oldest created two hours ago.  In one transaction, so that now()
-- and so max_delay_sec stay put: stats and events read the same after the
-- update.
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '0.2.0';
SELECT count(outbox.enqueue('Live', 'sent-' || i, '{}', topic => 'up')) FROM generate_series(1, 4) i;
UPDATE outbox.relay_cursor SET done_snapshot = pg_current_snapshot();
INSERT INTO outbox.event_state (id, status, attempts, last_error)
SELECT id, 'dead', 10, 'Broker: Message size too large' FROM outbox.event_log WHERE biz_key = 'sent-1';
INSERT INTO outbox.event_state (id, status, attempts, next_attempt_at, last_error)
SELECT id, 'new', 2, now() + interval '1 minute', 'Broker: Request timed out'
  FROM outbox.event_log WHERE biz_key = 'sent-2';
UPDATE outbox.event_log SET created_at = now() - interval '1 hour' WHERE biz_key = 'sent-2';
SELECT count(outbox.enqueue('Live', 'window-' || i, '{}', topic => 'up')) FROM generate_series(1, 3) i;
UPDATE outbox.relay_cursor
   SET window_snapshot = pg_current_snapshot(),
       window_last_id = (SELECT id FROM outbox.event_log WHERE biz_key = 'window-2'),
       window_max_id = (SELECT id FROM outbox.event_log WHERE biz_key = 'window-3');
SELECT count(outbox.enqueue('Live', 'unsent-' || i, '{}', topic => 'up')) FROM generate_series(1, 2) i;
UPDATE outbox.event_log SET created_at = now() - interval '2 hours' WHERE biz_key = 'unsent-1';
BEGIN;
CREATE TEMP TABLE stats_before AS SELECT backlog, max_delay_sec, dead, retrying FROM outbox.stats;
CREATE TEMP TABLE events_before AS SELECT id, biz_key, status, attempts, created_at FROM outbox.events;
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT 'before' AS read, backlog, max_delay_sec BETWEEN 7200 AND 7260 AS delay_from_unsent_1,
       dead, retrying FROM stats_before
UNION ALL
SELECT 'after', backlog, max_delay_sec BETWEEN 7200 AND 7260, dead, retrying FROM outbox.stats;
SELECT a.max_delay_sec = b.max_delay_sec AS same_delay FROM outbox.stats a, stats_before b;
SELECT biz_key, status, attempts FROM events_before ORDER BY id;
(SELECT 'only before: ' || e::text FROM events_before e
 EXCEPT SELECT 'only before: ' || e::text
          FROM (SELECT id, biz_key, status, attempts, created_at FROM outbox.events) e)
UNION ALL
(SELECT 'only after: ' || e::text
   FROM (SELECT id, biz_key, status, attempts, created_at FROM outbox.events) e
 EXCEPT SELECT 'only after: ' || e::text FROM events_before e)
ORDER BY 1;
COMMIT;

-- The upgrade refuses objects in schema outbox that outbox did not make,
-- and names them; once they are gone it goes through.
DROP EXTENSION outbox;
DROP SCHEMA outbox;
CREATE EXTENSION outbox VERSION '0.1.0';
CREATE FUNCTION outbox.nextval(text) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';
CREATE VIEW outbox.planted AS SELECT 1 AS one;
GRANT CREATE ON SCHEMA outbox TO PUBLIC;
ALTER EXTENSION outbox UPDATE;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
DROP FUNCTION outbox.nextval(text);
DROP VIEW outbox.planted;
REVOKE CREATE ON SCHEMA outbox FROM PUBLIC;
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';

\c :regress_db
DROP DATABASE outbox_upgrade;
