"""Order service, Avro: each order and its OrderCreated event in one
transaction, the event's value serialised by the application.

The value is Avro in the Confluent Schema Registry wire format (wire.py:
magic byte 0, a fixed schema id since this machine has no registry, the
Avro body; the schema is order.avsc), enqueued with outbox.enqueue_bytes,
which sends it byte for byte.  A content-type header tells consumers what
the bytes are.  Connects with libpq's PG* variables (PGUSER=order_service:
EXECUTE on outbox.enqueue_bytes and INSERT on orders, nothing else).
TOPIC, ORDER_PREFIX and ORDERS say where and how many.
"""
import hashlib
import json
import os

import psycopg

import wire

TOPIC = os.environ.get("TOPIC", "orders.python_avro")
PREFIX = os.environ.get("ORDER_PREFIX", "python_avro")
ORDERS = int(os.environ.get("ORDERS", "5"))

# psycopg sends Python bytes as bytea; the cast says so to every driver.
# The headers, JSON text, are cast as in the JSON example.
ENQUEUE_BYTES = """
    SELECT outbox.enqueue_bytes(biz_type => %s, biz_key => %s, payload => %s::bytea,
                                topic => %s, headers => %s::jsonb)
"""


def enqueue(conn, order):
    """Enqueue the order's event in conn's transaction; return its id and value."""
    value = wire.encode(order)
    headers = json.dumps({"content-type": wire.CONTENT_TYPE, "source": "python-avro-example"})
    row = conn.execute(
        ENQUEUE_BYTES, ("OrderCreated", order["order_id"], value, TOPIC, headers)
    ).fetchone()
    return row[0], value


def main():
    with psycopg.connect(autocommit=True) as conn:
        for i in range(1, ORDERS + 1):
            order = {"order_id": f"{PREFIX}-{i}", "sku": "sku-red", "qty": i}
            with conn.transaction():  # BEGIN ... COMMIT (ROLLBACK on error)
                conn.execute(
                    "INSERT INTO orders (id, sku, qty) VALUES (%s, %s, %s)",
                    (order["order_id"], order["sku"], order["qty"]),
                )
                event_id, value = enqueue(conn, order)
            print(f"order {order['order_id']}: committed with event {event_id},"
                  f" {len(value)} bytes sha256 {hashlib.sha256(value).hexdigest()}")

        # A retry of the same call (say, the COMMIT's answer was lost) finds
        # the event and returns its id: nothing new is enqueued.  Avro's
        # binary encoding of one record is deterministic, so the retry sends
        # the same bytes (other bytes under the same key would be 23505).
        with conn.transaction():
            again, _ = enqueue(conn, order)
        if again != event_id:
            raise SystemExit(f"retry returned event {again}, not {event_id}")
        print(f"order {order['order_id']}: retried enqueue returned event {again} again")


if __name__ == "__main__":
    main()
