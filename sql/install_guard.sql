-- CREATE EXTENSION refuses a schema named outbox that a non-superuser
-- made, may create objects in, or filled.  The attack seen: a database
-- owner (not a superuser) made schema outbox and outbox.nextval(text),
-- the install bound the id default to it, and the first enqueue ran it as
-- superuser.
\set regress_db :DBNAME
\set SHOW_CONTEXT never
CREATE ROLE outbox_db_owner LOGIN;
CREATE DATABASE outbox_guard OWNER outbox_db_owner;

-- The owner prepares the schema, and a function that would make it a
-- superuser if a superuser ran it.
\c outbox_guard outbox_db_owner
CREATE SCHEMA outbox;
CREATE FUNCTION outbox.nextval(text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE 'ALTER ROLE outbox_db_owner SUPERUSER';
    RETURN 1;
END $$;

-- A superuser installs: refused, with what is wrong and what to do.
\c outbox_guard postgres
CREATE EXTENSION outbox;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'outbox';
-- Had it installed, this would have run the owner's function as superuser.
SELECT outbox.enqueue('T', 'k', '{}');
SELECT rolsuper FROM pg_roles WHERE rolname = 'outbox_db_owner';

-- A superuser's schema is refused too while it holds anything, or while
-- a role that is not a superuser (or PUBLIC) may create objects in it.
DROP SCHEMA outbox CASCADE;
CREATE SCHEMA outbox;
CREATE TABLE outbox.event_log (id bigint);
CREATE EXTENSION outbox;
DROP TABLE outbox.event_log;
GRANT CREATE ON SCHEMA outbox TO outbox_db_owner, PUBLIC;
CREATE EXTENSION outbox;
REVOKE CREATE ON SCHEMA outbox FROM outbox_db_owner, PUBLIC;

-- Empty, a superuser's, CREATE for no one else: accepted.
CREATE EXTENSION outbox;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT outbox.enqueue('T', 'k', '{}') AS first_id;

\c :regress_db postgres
DROP DATABASE outbox_guard;
DROP ROLE outbox_db_owner;
