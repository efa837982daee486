-- examples/setup.sql: the shop database the examples run against, as a
-- superuser would set it up (README, "Roles and grants"): the extension,
-- the business tables, and one least-privilege role per side.

CREATE EXTENSION outbox;

-- The order service's table: one row per order, written in the same
-- transaction as its OrderCreated event.
CREATE TABLE orders (
    id text PRIMARY KEY,
    sku text NOT NULL,
    qty int NOT NULL
);

-- The inventory service's ledger: one row per reservation.  No unique key
-- on order_id on purpose: outbox.claim, not a constraint, is what keeps a
-- redelivered event from reserving twice (the examples' check counts rows).
CREATE TABLE reservations (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id text NOT NULL,
    sku text NOT NULL,
    qty int NOT NULL,
    event_id bigint NOT NULL
);

-- The producer: enqueue (JSON) and enqueue_bytes (the Avro example), and
-- its own table, nothing else.
CREATE ROLE order_service LOGIN;
GRANT USAGE ON SCHEMA outbox TO order_service;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, jsonb, text) TO order_service;
GRANT EXECUTE ON FUNCTION outbox.enqueue_bytes(text, text, bytea, text, jsonb, text) TO order_service;
GRANT INSERT ON orders TO order_service;
ALTER ROLE order_service SET outbox.allowed_topics = 'orders.*';

-- The consumer: claim, and its own table, nothing else.
CREATE ROLE inventory_service LOGIN;
GRANT USAGE ON SCHEMA outbox TO inventory_service;
GRANT EXECUTE ON FUNCTION outbox.claim(text, bigint, text, text, text) TO inventory_service;
GRANT INSERT ON reservations TO inventory_service;
ALTER ROLE inventory_service SET outbox.allowed_consumers = 'inventory-*';
