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

DROP OWNED BY outbox_nobody, outbox_producer, outbox_consumer, outbox_operator;
DROP ROLE outbox_nobody, outbox_producer, outbox_consumer, outbox_operator;
