-- outbox.claim(): first claim wins, duplicates are refused, rollback undoes.

-- First claim true, the redelivered duplicate false.
SELECT outbox.claim('inventory', 1) AS first;
SELECT outbox.claim('inventory', 1) AS duplicate;
-- Another consumer claims the same event independently.
SELECT outbox.claim('marketing', 1) AS other_consumer;
SELECT consumer, event_id, biz_type, biz_key, processed_at <= now() AS stamped
  FROM outbox.consumer_dedup ORDER BY consumer, event_id;

-- The business key refuses the same fact under another event id.
SELECT outbox.claim('inventory', 10, 'OrderCreated', 'order-1') AS first;
SELECT outbox.claim('inventory', 11, 'OrderCreated', 'order-1') AS same_fact_new_id;
SELECT outbox.claim('inventory', 10, 'OrderCreated', 'order-2') AS same_id_other_fact;
SELECT outbox.claim(consumer => 'inventory', event_id => 12,
                    biz_type => 'OrderCreated', biz_key => 'order-3') AS named_args;

-- A rolled-back business step leaves no claim: the redelivery applies it.
BEGIN;
SELECT outbox.claim('inventory', 20) AS claimed_in_failed_tx;
ROLLBACK;
SELECT outbox.claim('inventory', 20) AS claimed_on_redelivery;

-- A claim inside a savepoint is undone with the savepoint.
BEGIN;
SAVEPOINT step;
SELECT outbox.claim('inventory', 21) AS claimed;
ROLLBACK TO step;
SELECT outbox.claim('inventory', 21) AS claimed_again;
COMMIT;
SELECT count(*) FROM outbox.consumer_dedup WHERE event_id = 21;

-- The claim and the business write commit together.
CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL);
INSERT INTO stock VALUES ('sku-1', 0);
CREATE FUNCTION pg_temp.reserve(evt bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF outbox.claim('stock', evt) THEN
        UPDATE stock SET reserved = reserved + 1 WHERE sku = 'sku-1';
    END IF;
END $$;
SELECT pg_temp.reserve(30);
SELECT pg_temp.reserve(30);
SELECT pg_temp.reserve(31);
SELECT reserved FROM stock;

-- Bad arguments.
SELECT err($$SELECT outbox.claim(NULL, 1)$$);
SELECT err($$SELECT outbox.claim('', 1)$$);
SELECT err($$SELECT outbox.claim('c', NULL)$$);
SELECT err($$SELECT outbox.claim('c', 1, 'OrderCreated')$$);
SELECT err($$SELECT outbox.claim('c', 1, NULL, 'order-1')$$);
SELECT err($$SELECT outbox.claim('c', 1, '', 'order-1')$$);
SELECT err($$SELECT outbox.claim('c', 1, 'OrderCreated', '')$$);
SELECT err(format('SELECT outbox.claim(%L, 1)', repeat('c', 257)));
-- The longest consumer with the longest keys and source, all
-- incompressible, still fits in consumer_dedup's unique index on
-- (consumer, biz_type, biz_key, source).
BEGIN;
SELECT outbox.claim((SELECT string_agg(md5('c' || i), '') FROM generate_series(1, 8) i), 1,
                    (SELECT string_agg(md5('t' || i), '') FROM generate_series(1, 32) i),
                    (SELECT string_agg(md5('k' || i), '') FROM generate_series(1, 32) i),
                    (SELECT string_agg(md5('s' || i), '') FROM generate_series(1, 2) i)) AS longest_keys;
ROLLBACK;

-- Claims are per source (the event's outbox_source header): two databases
-- on one topic each have an event 1, and a business key of their own.
SELECT outbox.claim('orders', 1, 'OrderCreated', 'o-1', 'source-a') AS a_first;
SELECT outbox.claim('orders', 1, 'OrderCreated', 'o-9', 'source-b') AS b_same_id;
SELECT outbox.claim('orders', 2, 'OrderCreated', 'o-1', 'source-b') AS b_same_key;
SELECT outbox.claim('orders', 1, 'OrderCreated', 'o-1', 'source-a') AS a_again;
SELECT outbox.claim('orders', 3, 'OrderCreated', 'o-1', 'source-a') AS a_same_key;
-- A claim made without a source (as before 0.3.0) still refuses the event
-- and the business key for every source; a NULL source is no source.
SELECT outbox.claim('legacy', 5, 'OrderCreated', 'o-5') AS no_source;
SELECT outbox.claim('legacy', 5, 'OrderCreated', 'o-6', 'source-a') AS id_claimed_before;
SELECT outbox.claim('legacy', 6, 'OrderCreated', 'o-5', 'source-a') AS key_claimed_before;
SELECT outbox.claim('legacy', 7, 'OrderCreated', 'o-7', NULL) AS null_source;
SELECT outbox.claim('legacy', 7, 'OrderCreated', 'o-7') AS null_is_none;
SELECT err($$SELECT outbox.claim('c', 1, 'T', 'k', '')$$);
SELECT err(format('SELECT outbox.claim(%L, 1, %L, %L, %L)', 'c', 'T', 'k', repeat('s', 65)));
SELECT count(*) FROM outbox.consumer_dedup WHERE consumer IN ('c', '');
-- A duplicate writes WAL (it locks the claim it found), so its COMMIT waits
-- for a synchronous standby as the first claim's did.
SELECT outbox.claim('wal-check', 424242) AS first;
BEGIN;
SELECT pg_current_wal_insert_lsn() AS before \gset
SELECT outbox.claim('wal-check', 424242) AS again;
SELECT pg_current_wal_insert_lsn() > :'before' AS wrote_wal;
COMMIT;

-- Claims of both forms see each other (test/specs/claim_forms.spec runs
-- them concurrently).  For it each claim takes a lock per consumer, of its
-- form's mode; a transaction of thousands of claims holds it once, one
-- entry of the shared lock table for each form, however many it claims.
BEGIN;
SELECT count(*) FILTER (WHERE outbox.claim('bulk', g)) AS four_arg_first
  FROM generate_series(1, 10000) g;
SELECT count(*) FILTER (WHERE outbox.claim('bulk', g, NULL, NULL, 'source-a')) AS five_arg_first
  FROM generate_series(1, 10000) g;
SELECT locktype, mode, granted, objsubid
  FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'
 ORDER BY mode;
ROLLBACK;
