-- An update keeps what users attached to outbox's objects.  From 0.1.0 and
-- from 0.2.0, with the install guide's roles and grants of that time and
-- events in every state: after ALTER EXTENSION outbox UPDATE each role may
-- do exactly what it could before, and nothing more (a role granted
-- nothing, as PUBLIC, still nothing); a user's view on outbox.stats keeps
-- working, and users' comments on the views stay.  A user's object on
-- something the update drops makes it refuse, naming the object.
\set regress_db :DBNAME
\set SHOW_CONTEXT never
\set VERBOSITY default
CREATE DATABASE outbox_upgrade_grants;
\c outbox_upgrade_grants

-- The install guide's roles (docs/install.md, "Roles and grants", as it was
-- for 0.1.0 and 0.2.0: enqueue_bytes and the five-argument claim came with
-- 0.3.0), and a role granted nothing: what PUBLIC may do.
CREATE ROLE order_service LOGIN;
CREATE ROLE inventory_service LOGIN;
CREATE ROLE outbox_operator LOGIN;
CREATE ROLE outbox_outsider LOGIN;
SET check_function_bodies = off;

-- guide_grants(): the guide's GRANTs for 0.1.0 and 0.2.0, word for word.
CREATE FUNCTION public.guide_grants() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    GRANT USAGE ON SCHEMA outbox TO order_service;
    GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, jsonb, text) TO order_service;
    GRANT USAGE ON SCHEMA outbox TO inventory_service;
    GRANT EXECUTE ON FUNCTION outbox.claim(text, bigint, text, text) TO inventory_service;
    GRANT USAGE ON SCHEMA outbox TO outbox_operator;
    GRANT SELECT ON outbox.events, outbox.stats, outbox.dead_letters, outbox.consumer_dedup TO outbox_operator;
    GRANT EXECUTE ON FUNCTION outbox.relay_status(), outbox.pause(), outbox.resume(),
          outbox.replay(bigint), outbox.replay_dead(text, timestamptz) TO outbox_operator;
END $$;

-- live_events(), then live_states() in a later transaction: events as a
-- relay leaves them (sent; dead; waiting for a retry; unsent) and a claim
-- made by the consumer's role.
CREATE FUNCTION public.live_events() RETURNS void LANGUAGE sql AS $$
    SELECT count(outbox.enqueue('Live', 'sent-' || i, '{}', topic => 'up')) FROM generate_series(1, 3) i;
$$;
CREATE FUNCTION public.live_states() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE outbox.relay_cursor SET done_snapshot = pg_current_snapshot();
    INSERT INTO outbox.event_state (id, status, attempts, last_error)
    SELECT id, 'dead', 10, 'Broker: Message size too large' FROM outbox.event_log WHERE biz_key = 'sent-1';
    INSERT INTO outbox.event_state (id, status, attempts, last_error)
    SELECT id, 'new', 2, 'Broker: Request timed out' FROM outbox.event_log WHERE biz_key = 'sent-2';
    PERFORM outbox.enqueue('Live', 'unsent-' || i, '{}', topic => 'up') FROM generate_series(1, 2) i;
    SET LOCAL ROLE inventory_service;
    PERFORM outbox.claim('inventory', 1, 'Live', 'sent-1');
    RESET ROLE;
END $$;

-- may(): what each role may do with each object of schema outbox, as
-- PostgreSQL's has_*_privilege() says (grants to PUBLIC count).
CREATE FUNCTION public.may() RETURNS TABLE (who name, what text, priv text) LANGUAGE sql AS $$
    SELECT r.rolname, 'schema outbox', p
      FROM pg_roles r, unnest(ARRAY['USAGE', 'CREATE']) p
     WHERE r.rolname IN ('order_service', 'inventory_service', 'outbox_operator', 'outbox_outsider')
       AND has_schema_privilege(r.oid, 'outbox', p)
    UNION ALL
    SELECT r.rolname, c.oid::regclass::text, p
      FROM pg_roles r, pg_class c,
           unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p
     WHERE r.rolname IN ('order_service', 'inventory_service', 'outbox_operator', 'outbox_outsider')
       AND c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'v', 'p')
       AND has_table_privilege(r.oid, c.oid, p)
    UNION ALL
    SELECT r.rolname, c.oid::regclass::text, p
      FROM pg_roles r, pg_class c, unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) p
     WHERE r.rolname IN ('order_service', 'inventory_service', 'outbox_operator', 'outbox_outsider')
       AND c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'S'
       AND has_sequence_privilege(r.oid, c.oid, p)
    UNION ALL
    SELECT r.rolname, p.oid::regprocedure::text, 'EXECUTE'
      FROM pg_roles r, pg_proc p
     WHERE r.rolname IN ('order_service', 'inventory_service', 'outbox_operator', 'outbox_outsider')
       AND p.pronamespace = 'outbox'::regnamespace
       AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
$$;

-- calls(): each role runs each call of the API (SET ROLE); 'ok' or the
-- SQLSTATE it got.
CREATE FUNCTION public.calls() RETURNS TABLE (who name, call text, result text) LANGUAGE plpgsql AS $$
DECLARE
    c text;
BEGIN
    FOR who IN SELECT unnest(ARRAY['order_service', 'inventory_service', 'outbox_operator',
                                   'outbox_outsider']::name[]) LOOP
        FOREACH c IN ARRAY ARRAY[
            $q$SELECT outbox.enqueue('Probe', md5(random()::text), '{}', topic => 'up')$q$,
            $q$SELECT outbox.claim('inventory', (random() * 1e12)::bigint, 'Probe', md5(random()::text))$q$,
            'SELECT count(*) FROM outbox.events',
            'SELECT * FROM outbox.stats',
            'SELECT count(*) FROM outbox.dead_letters',
            'SELECT count(*) FROM outbox.consumer_dedup',
            'SELECT count(*) FROM outbox.event_log',
            'SELECT count(*) FROM outbox.event_state',
            'SELECT count(*) FROM outbox.relay_cursor',
            'SELECT count(*) FROM outbox.relay_control',
            'SELECT count(*) FROM outbox.relay_status()',
            'SELECT outbox.pause()',
            'SELECT outbox.resume()',
            'SELECT outbox.replay(0)',
            $q$SELECT outbox.replay_dead('NoSuchType')$q$,
            $q$SELECT outbox.resend(now() + interval '1 day')$q$,
            $q$INSERT INTO outbox.consumer_dedup (consumer, event_id) VALUES ('forged', -1)$q$] LOOP
            call := c;
            BEGIN
                EXECUTE format('SET ROLE %I', who);
                EXECUTE c;
                RESET ROLE;
                result := 'ok';
            EXCEPTION WHEN OTHERS THEN
                result := SQLSTATE;
            END;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END $$;

-- before(): what each role may do and does, and the comments on outbox's
-- views and functions, before the update.
CREATE TABLE may_before (who name, what text, priv text);
CREATE TABLE calls_before (who name, call text, result text);
CREATE TABLE comments_before (what text, comment text);
CREATE FUNCTION public.comments() RETURNS TABLE (what text, comment text) LANGUAGE sql AS $$
    SELECT c.oid::regclass::text, obj_description(c.oid, 'pg_class')
      FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace
    UNION ALL
    SELECT p.oid::regprocedure::text, obj_description(p.oid, 'pg_proc')
      FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace
$$;
CREATE FUNCTION public.before() RETURNS void LANGUAGE sql AS $$
    TRUNCATE may_before, calls_before, comments_before;
    INSERT INTO may_before SELECT * FROM may();
    INSERT INTO calls_before SELECT * FROM calls();
    INSERT INTO comments_before SELECT * FROM comments();
$$;

-- changed(): privileges and call results only one side has (none; a
-- function the old version lacked, 42883 before, is no change), and our
-- comments ('Ours: ...') that the update did not keep.
CREATE FUNCTION public.changed() RETURNS SETOF text LANGUAGE sql AS $$
    (SELECT format('lost: %s %s %s', who, priv, what) FROM may_before
     EXCEPT SELECT format('lost: %s %s %s', who, priv, what) FROM may())
    UNION ALL
    (SELECT format('gained: %s %s %s', who, priv, what) FROM may()
     EXCEPT SELECT format('gained: %s %s %s', who, priv, what) FROM may_before)
    UNION ALL
    (SELECT format('call: %s %s: %s before, %s after', b.who, b.call, b.result, a.result)
       FROM calls_before b JOIN calls() a USING (who, call)
      WHERE a.result <> b.result AND b.result <> '42883')
    UNION ALL
    (SELECT format('comment on %s: %s, now %s', b.what, b.comment,
                   COALESCE(left(a.comment, 40) || '...', 'none'))
       FROM comments_before b LEFT JOIN comments() a USING (what)
      WHERE b.comment LIKE 'Ours:%' AND a.comment IS DISTINCT FROM b.comment)
    ORDER BY 1
$$;

-- From 0.1.0: the guide's grants, live events, our comments on two views.
CREATE EXTENSION outbox VERSION '0.1.0';
SELECT guide_grants(), live_events();
SELECT live_states();
COMMENT ON VIEW outbox.stats IS 'Ours: the exporter reads this.';
COMMENT ON VIEW outbox.events IS 'Ours: the operator''s view.';
COMMENT ON FUNCTION outbox.claim(text, bigint, text, text) IS 'Ours: inventory''s only.';
-- 0.1.0 -> 0.2.0 (released) sets these functions' comments again: ours on
-- them are lost from 0.1.0 (docs/install.md says so).
COMMENT ON FUNCTION outbox.pause() IS 'Ours: page the on-call first.';
SELECT before();
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT * FROM changed();
-- What each role may call after the update, 0.3.0's new functions too:
-- nobody is granted those (a GRANT, as the guide says for 0.3.0).
SELECT who, call FROM calls() WHERE result = 'ok' ORDER BY 1, 2;
SELECT r.rolname, f, has_function_privilege(r.oid, f, 'EXECUTE') AS may_execute
  FROM pg_roles r,
       unnest(ARRAY['outbox.enqueue_bytes(text, text, bytea, text, jsonb, text)',
                    'outbox.claim(text, bigint, text, text, text)']) f
 WHERE r.rolname IN ('order_service', 'inventory_service', 'outbox_operator', 'outbox_outsider')
 ORDER BY 1, 2;
SELECT status, count(*) FROM outbox.events WHERE biz_type = 'Live' GROUP BY 1 ORDER BY 1;

-- From 0.2.0, the same.
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '0.2.0';
SELECT guide_grants(), live_events();
SELECT live_states();
COMMENT ON VIEW outbox.stats IS 'Ours: the exporter reads this.';
COMMENT ON VIEW outbox.dead_letters IS 'Ours: the on-call''s view.';
COMMENT ON FUNCTION outbox.relay_status() IS 'Ours: the exporter calls this.';
COMMENT ON INDEX outbox.event_log_created_at IS 'Ours: retention''s.';
COMMENT ON FUNCTION outbox.pause() IS 'Ours: page the on-call first.';
SELECT before();
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT * FROM changed();
SELECT who, call FROM calls() WHERE result = 'ok' ORDER BY 1, 2;
SELECT status, count(*) FROM outbox.events WHERE biz_type = 'Live' GROUP BY 1 ORDER BY 1;

-- Without comments of ours the update sets its own (a fresh install's).
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '0.2.0';
ALTER EXTENSION outbox UPDATE;
SELECT obj_description('outbox.stats'::regclass, 'pg_class') LIKE '%relay_state%' AS shipped_comment;

-- An exporter's view on outbox.stats, granted to the operator, from 0.1.0
-- and from 0.2.0: it reads the same after the update.
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '0.1.0';
SELECT guide_grants(), live_events();
SELECT live_states();
CREATE VIEW public.stats_watch AS SELECT backlog, dead, retrying FROM outbox.stats;
GRANT SELECT ON public.stats_watch TO outbox_operator;
SET ROLE outbox_operator;
SELECT * FROM stats_watch;
RESET ROLE;
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SET ROLE outbox_operator;
SELECT * FROM stats_watch;
RESET ROLE;
DROP VIEW stats_watch;
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '0.2.0';
SELECT guide_grants(), live_events();
SELECT live_states();
CREATE VIEW public.stats_watch AS SELECT backlog, dead, retrying FROM outbox.stats;
GRANT SELECT ON public.stats_watch TO outbox_operator;
SET ROLE outbox_operator;
SELECT * FROM stats_watch;
RESET ROLE;
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SET ROLE outbox_operator;
SELECT * FROM stats_watch;
RESET ROLE;
DROP VIEW stats_watch;

-- A user's view on a column the update drops (relay_cursor.window_max_id)
-- and a foreign key on a constraint it replaces (consumer_dedup_pkey): the
-- update refuses and names them; once they are gone it goes through.
DROP EXTENSION outbox;
CREATE EXTENSION outbox VERSION '0.2.0';
CREATE VIEW public.cursor_watch AS SELECT window_last_id, window_max_id FROM outbox.relay_cursor;
CREATE TABLE public.applied (consumer text, event_id bigint,
                             FOREIGN KEY (consumer, event_id) REFERENCES outbox.consumer_dedup);
ALTER EXTENSION outbox UPDATE;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
DROP VIEW cursor_watch;
DROP TABLE applied;
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';

\c :regress_db
DROP DATABASE outbox_upgrade_grants;
DROP ROLE order_service, inventory_service, outbox_operator, outbox_outsider;
