-- test/chaos/schema.sql: the two services of the chaos suite.
--
-- shop: an order and its event in one transaction (the producer side).
-- inventory: a reservation ledger applied once per event through
-- outbox.claim (the consumer side, the design article's section 5.3).
-- psql variables: :db names the database to set up (shop or inventory).

\if :{?db}
\else
\echo 'usage: psql -v db=shop|inventory -f test/chaos/schema.sql'
\quit
\endif

CREATE EXTENSION IF NOT EXISTS outbox;

SELECT :'db' = 'shop' AS is_shop \gset
\if :is_shop

CREATE TABLE orders (
    ref       text PRIMARY KEY,
    sku       text NOT NULL,
    qty       int  NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now()
);

-- The business write and its event, atomically.  A retry with the same
-- ref changes nothing and returns the same event id.
CREATE FUNCTION place_order(ref text, sku text, qty int, seq int, topic text)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO orders (ref, sku, qty) VALUES (ref, sku, qty) ON CONFLICT DO NOTHING;
    SELECT outbox.enqueue('OrderPlaced', ref,
                          jsonb_build_object('ref', ref, 'sku', sku, 'qty', qty, 'seq', seq),
                          topic => topic, msg_key => sku);
$$;

\else

-- No unique constraint on event_id on purpose: only the claim stands
-- between a redelivery and a second reservation.
CREATE TABLE reservations (
    n          bigserial PRIMARY KEY,
    event_id   bigint NOT NULL,
    order_ref  text   NOT NULL,
    sku        text   NOT NULL,
    qty        int    NOT NULL,
    seq        int    NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Every redelivery the claim refused, written in the refusing transaction:
-- unlike the consumer's own counters it survives the consumer's SIGKILL,
-- so the suite can check that redeliveries happened and were refused.
CREATE TABLE refusals (
    event_id   bigint NOT NULL,
    refused_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE stock (
    sku      text PRIMARY KEY,
    reserved bigint NOT NULL
);

-- Apply one order event: true if applied, false if it was already.
CREATE FUNCTION reserve(event_id bigint, biz_type text, biz_key text, payload jsonb)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT outbox.claim('inventory', event_id, biz_type, biz_key) THEN
        INSERT INTO refusals (event_id) VALUES (event_id);
        RETURN false;
    END IF;
    INSERT INTO reservations (event_id, order_ref, sku, qty, seq)
    VALUES (event_id, payload->>'ref', payload->>'sku', (payload->>'qty')::int, (payload->>'seq')::int);
    INSERT INTO stock AS s (sku, reserved) VALUES (payload->>'sku', (payload->>'qty')::int)
    ON CONFLICT (sku) DO UPDATE SET reserved = s.reserved + excluded.reserved;
    RETURN true;
END $$;

\endif
