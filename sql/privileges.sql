-- Least privilege: PUBLIC gets nothing; a producer can only enqueue, a
-- consumer can only claim; an operator can read.

CREATE ROLE outbox_nobody;
CREATE ROLE outbox_producer;
CREATE ROLE outbox_consumer;
CREATE ROLE outbox_operator;
GRANT USAGE ON SCHEMA outbox TO outbox_producer, outbox_consumer, outbox_operator;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, jsonb, text) TO outbox_producer;
GRANT EXECUTE ON FUNCTION outbox.claim(text, bigint, text, text) TO outbox_consumer;
GRANT SELECT ON outbox.events, outbox.consumer_dedup TO outbox_operator;

-- PUBLIC has no privilege on any outbox object.
SELECT c.relname, c.relkind,
       CASE c.relkind WHEN 'S'
            THEN has_sequence_privilege('outbox_nobody', c.oid, 'USAGE, SELECT, UPDATE')
            ELSE has_table_privilege('outbox_nobody', c.oid,
                     'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
       END AS public_has_any
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'v', 'S')
 ORDER BY 1;
SELECT p.proname, has_function_privilege('outbox_nobody', p.oid, 'EXECUTE') AS public_can_execute
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'outbox' ORDER BY 1;
SELECT has_schema_privilege('outbox_nobody', 'outbox', 'USAGE') AS public_usage;

-- Functions that run with the owner's rights pin their search_path.
SELECT p.proname, p.prosecdef, p.proconfig
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'outbox' ORDER BY 1;

-- A role with no grants can do nothing.
SET ROLE outbox_nobody;
SELECT err($$SELECT outbox.enqueue('T', 'nobody', '{}')$$);
SELECT err($$SELECT outbox.claim('c', 1)$$);
SELECT err($$SELECT * FROM outbox.events$$);
RESET ROLE;

-- The producer enqueues, but cannot read, change or delete rows, nor claim.
SET ROLE outbox_producer;
SELECT outbox.enqueue('T', 'by-producer', '{}') IS NOT NULL AS enqueued;
SELECT err($$SELECT * FROM outbox.events$$);
SELECT err($$SELECT * FROM outbox.event_log$$);
SELECT err($$UPDATE outbox.event_log SET topic = 'x'$$);
SELECT err($$DELETE FROM outbox.event_log$$);
SELECT err($$INSERT INTO outbox.event_log (biz_type, biz_key, topic, msg_key, payload) VALUES ('T', 'direct', 't', 'k', '{}')$$);
SELECT err($$UPDATE outbox.event_state SET status = 'sent'$$);
SELECT err($$SELECT nextval('outbox.event_id_seq')$$);
SELECT err($$SELECT outbox.claim('c', 1)$$);
RESET ROLE;

-- The consumer claims, but cannot touch the dedup rows or enqueue.
SET ROLE outbox_consumer;
SELECT outbox.claim('by-consumer', 1) AS claimed;
SELECT err($$SELECT * FROM outbox.consumer_dedup$$);
SELECT err($$DELETE FROM outbox.consumer_dedup$$);
SELECT err($$INSERT INTO outbox.consumer_dedup (consumer, event_id) VALUES ('x', 2)$$);
SELECT err($$SELECT outbox.enqueue('T', 'by-consumer', '{}')$$);
RESET ROLE;

-- The operator reads, but cannot change.
SET ROLE outbox_operator;
SELECT biz_key, status FROM outbox.events WHERE biz_key = 'by-producer';
SELECT consumer, event_id FROM outbox.consumer_dedup WHERE consumer = 'by-consumer';
SELECT err($$DELETE FROM outbox.event_log$$);
SELECT err($$SELECT outbox.enqueue('T', 'by-operator', '{}')$$);
RESET ROLE;

-- A hostile search_path cannot redirect what enqueue runs: an "=" that
-- calls every payload equal would turn the conflict below into a silent
-- success if enqueue's queries resolved it.
CREATE SCHEMA evil;
GRANT ALL ON SCHEMA evil TO outbox_producer;
SET ROLE outbox_producer;
SELECT outbox.enqueue('T', 'search-path', '{"v": 1}') IS NOT NULL AS enqueued;
CREATE FUNCTION evil.always(jsonb, jsonb) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR evil.= (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = evil.always);
SET search_path = evil, pg_catalog;
SELECT '{"v": 1}'::jsonb = '{"v": 2}'::jsonb AS hijacked_here;
SELECT public.err($$SELECT outbox.enqueue('T', 'search-path', '{"v": 2}')$$);
RESET search_path;
RESET ROLE;
SELECT payload FROM outbox.event_log WHERE biz_key = 'search-path';
DROP SCHEMA evil CASCADE;

-- A role that may create objects (as a database owner may) puts a schema
-- first in its search_path with operators and functions of the names and
-- argument types enqueue's and claim's statements could resolve; each
-- records that it ran and tries to make the role a superuser.  enqueue
-- and claim run with the extension owner's rights and no pinned
-- search_path, and must still answer right, running none of them.
CREATE ROLE outbox_owner;
GRANT USAGE ON SCHEMA outbox TO outbox_owner;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, jsonb, text),
                          outbox.enqueue_bytes(text, text, bytea, text, jsonb, text),
                          outbox.claim(text, bigint, text, text) TO outbox_owner;
CREATE SCHEMA trap AUTHORIZATION outbox_owner;
SET ROLE outbox_owner;
CREATE TABLE trap.ran (fn text, as_user name);
GRANT ALL ON trap.ran TO PUBLIC;
CREATE FUNCTION trap.hostile(fn text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO trap.ran VALUES (fn, current_user);
    BEGIN
        EXECUTE 'ALTER ROLE outbox_owner SUPERUSER';
    EXCEPTION WHEN insufficient_privilege THEN NULL;
    END;
END $f$;
CREATE FUNCTION trap.eq_text(text, text) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('=(text,text)'); RETURN true; END $f$;
CREATE FUNCTION trap.eq_jsonb(jsonb, jsonb) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('=(jsonb,jsonb)'); RETURN true; END $f$;
CREATE FUNCTION trap.eq_bytea(bytea, bytea) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('=(bytea,bytea)'); RETURN true; END $f$;
CREATE FUNCTION trap.eq_int8(bigint, bigint) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('=(bigint,bigint)'); RETURN true; END $f$;
CREATE FUNCTION trap.eq_text_varchar(text, varchar) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('=(text,varchar)'); RETURN true; END $f$;
CREATE FUNCTION trap.eq_any(anyelement, anyelement) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('=(anyelement,anyelement)'); RETURN true; END $f$;
CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = trap.eq_text);
CREATE OPERATOR trap.= (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = trap.eq_jsonb);
CREATE OPERATOR trap.= (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = trap.eq_bytea);
CREATE OPERATOR trap.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = trap.eq_int8);
CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = varchar, FUNCTION = trap.eq_text_varchar);
CREATE OPERATOR trap.= (LEFTARG = anyelement, RIGHTARG = anyelement, FUNCTION = trap.eq_any);
CREATE FUNCTION trap.nextval(regclass) RETURNS bigint LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('nextval(regclass)'); RETURN 1; END $f$;
CREATE FUNCTION trap.nextval(text) RETURNS bigint LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('nextval(text)'); RETURN 1; END $f$;
CREATE FUNCTION trap.now() RETURNS timestamptz LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('now()'); RETURN '2000-01-01'; END $f$;
CREATE FUNCTION trap.pg_current_xact_id() RETURNS xid8 LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM trap.hostile('pg_current_xact_id()'); RETURN '1'; END $f$;
SET search_path = trap, pg_catalog, public;
-- The trap works on whoever resolves these names through the path.
SELECT 'a'::text = 'b'::text AS hijacked_here, '1'::jsonb = '2'::jsonb AS hijacked_too;
SELECT fn FROM trap.ran ORDER BY fn;
TRUNCATE trap.ran;
-- enqueue: first, retried with the same content (with and without
-- headers), retried with other content.
SELECT outbox.enqueue('T', 'trap-1', '{"v": 1}', headers => '{"h": "1"}') AS trap_id \gset
SELECT outbox.enqueue('T', 'trap-1', '{"v": 1}', headers => '{"h": "1"}') = :trap_id AS retry_same_id;
SELECT outbox.enqueue('T', 'trap-2', '{"v": 1}') AS trap_id2 \gset
SELECT outbox.enqueue('T', 'trap-2', '{"v": 1}') = :trap_id2 AS retry_same_id_no_headers;
SELECT public.err($$SELECT outbox.enqueue('T', 'trap-1', '{"v": 1}', headers => '{"h": "2"}')$$);
SELECT public.err($$SELECT outbox.enqueue('T', 'trap-1', '{"v": 2}', headers => '{"h": "1"}')$$);
SELECT public.err($$SELECT outbox.enqueue('T', 'trap-2', '{"v": 1}', headers => '{"h": "1"}')$$);
SELECT public.err($$SELECT outbox.enqueue('T', 'trap-2', '{"v": 1}', topic => 'other')$$);
-- enqueue_bytes: the same, with bytes.
SELECT outbox.enqueue_bytes('T', 'trap-b', '\x0001') AS trap_bytes_id \gset
SELECT outbox.enqueue_bytes('T', 'trap-b', '\x0001') = :trap_bytes_id AS bytes_retry_same_id;
SELECT public.err($$SELECT outbox.enqueue_bytes('T', 'trap-b', '\x0002')$$);
-- claim: first and duplicate, by event id and by business key.
SELECT outbox.claim('trap', :trap_id) AS first, outbox.claim('trap', :trap_id) AS duplicate;
SELECT outbox.claim('trap', :trap_id2, 'T', 'trap-2') AS first_by_key,
       outbox.claim('trap', 999999, 'T', 'trap-2') AS duplicate_by_key,
       outbox.claim('trap', 999998, 'T', 'trap-3') AS other_key;
RESET search_path;
RESET ROLE;
-- Nothing of the trap ran, and the role is no superuser.
SELECT fn, as_user FROM trap.ran;
SELECT rolsuper FROM pg_roles WHERE rolname = 'outbox_owner';
SELECT biz_key, payload, headers FROM outbox.event_log WHERE biz_key LIKE 'trap-%' ORDER BY id;
SELECT consumer, event_id = :trap_id AS is_trap_id, biz_key FROM outbox.consumer_dedup
 WHERE consumer = 'trap' ORDER BY event_id;
DROP SCHEMA trap CASCADE;

-- Roles bound to topics and consumer names: outbox.allowed_topics and
-- outbox.allowed_consumers, set per role by a superuser, a trailing "*"
-- for a prefix.  The login role's settings apply when it connects.
CREATE ROLE outbox_tenant LOGIN;
GRANT USAGE ON SCHEMA outbox TO outbox_tenant;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, jsonb, text),
                          outbox.claim(text, bigint, text, text) TO outbox_tenant;
ALTER ROLE outbox_tenant SET outbox.allowed_topics = 'orders.*, billing';
ALTER ROLE outbox_tenant SET outbox.allowed_consumers = 'stock,stock-*';
SELECT current_user AS superuser \gset
\c - outbox_tenant
SELECT outbox.enqueue('T', 'tenant-1', '{}', topic => 'orders.created') IS NOT NULL AS prefix_ok;
SELECT outbox.enqueue('T', 'tenant-2', '{}', topic => 'orders.') IS NOT NULL AS bare_prefix_ok;
SELECT outbox.enqueue('T', 'tenant-3', '{}', topic => 'billing') IS NOT NULL AS exact_ok;
SELECT public.err($$SELECT outbox.enqueue('T', 'tenant-4', '{}', topic => 'billing.eu')$$);
SELECT public.err($$SELECT outbox.enqueue('T', 'tenant-5', '{}', topic => 'orders')$$);
SELECT public.err($$SELECT outbox.enqueue('T', 'tenant-6', '{}', topic => 'Orders.created')$$);
-- The default topic is held to the list too; the hint names the setting.
SELECT outbox.enqueue('T', 'tenant-7', '{}');
SELECT outbox.claim('stock', 1) AS exact_ok, outbox.claim('stock-eu', 1) AS prefix_ok;
SELECT outbox.claim('stock', 2, 'T', 'tenant-1') AS by_key_ok;
SELECT outbox.claim('billing', 1);
SELECT public.err($$SELECT outbox.claim('stock2', 1)$$);
-- The role can change none of this, nor where events go by default.
SELECT public.err($$SET outbox.allowed_topics = ''$$);
SELECT public.err($$RESET outbox.allowed_consumers$$);
SELECT public.err($$SELECT set_config('outbox.allowed_topics', '*', false)$$);
SELECT public.err($$SET outbox.default_topic = '__consumer_offsets'$$);
SELECT public.err($$SET outbox.default_topic = 'orders.{biz_type}'$$);
SELECT public.err($$ALTER ROLE outbox_tenant RESET outbox.allowed_topics$$);
\c - :superuser
SELECT biz_key, topic FROM outbox.event_log WHERE biz_key LIKE 'tenant-%' ORDER BY biz_key;
SELECT consumer, event_id FROM outbox.consumer_dedup WHERE consumer LIKE 'stock%' AND event_id IN (1, 2)
 ORDER BY 1, 2;

DROP OWNED BY outbox_nobody, outbox_producer, outbox_consumer, outbox_operator, outbox_owner,
              outbox_tenant;
DROP ROLE outbox_nobody, outbox_producer, outbox_consumer, outbox_operator, outbox_owner,
          outbox_tenant;
