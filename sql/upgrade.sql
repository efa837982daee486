-- 0.1.0 upgraded to 0.2.0 gives the schema a fresh 0.2.0 install gives;
-- the upgrade refuses a schema holding objects that are not outbox's.
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

-- 0.1.0 with some data, then the update.
CREATE EXTENSION outbox VERSION '0.1.0';
SELECT outbox.enqueue('T', 'before-update', '{}') IS NOT NULL AS enqueued;
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
CREATE TABLE upgraded AS SELECT * FROM schema_lines() AS line;

-- A fresh 0.2.0 install in the same database.
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
