"""Order service: each order and its OrderCreated event in one transaction.

Connects with libpq's PG* variables (PGUSER=order_service: EXECUTE on
outbox.enqueue and INSERT on orders, nothing else).  TOPIC, ORDER_PREFIX
and ORDERS say where and how many.
"""
import json
import os

import psycopg

TOPIC = os.environ.get("TOPIC", "orders.python")
PREFIX = os.environ.get("ORDER_PREFIX", "python")
ORDERS = int(os.environ.get("ORDERS", "5"))

# JSON text bound as a parameter, cast in the SQL: works with every driver.
# (psycopg also takes psycopg.types.json.Jsonb(a_dict); a plain dict fails.)
ENQUEUE = """
    SELECT outbox.enqueue(biz_type => %s, biz_key => %s, payload => %s::jsonb,
                          topic => %s, headers => %s::jsonb)
"""


def enqueue(conn, order):
    """Enqueue the order's event in conn's transaction; return its id."""
    payload = json.dumps(order)
    headers = json.dumps({"source": "python-example"})
    row = conn.execute(
        ENQUEUE, ("OrderCreated", order["order_id"], payload, TOPIC, headers)
    ).fetchone()
    return row[0]


def main():
    with psycopg.connect(autocommit=True) as conn:
        for i in range(1, ORDERS + 1):
            order = {"order_id": f"{PREFIX}-{i}", "sku": "sku-red", "qty": i}
            with conn.transaction():  # BEGIN ... COMMIT (ROLLBACK on error)
                conn.execute(
                    "INSERT INTO orders (id, sku, qty) VALUES (%s, %s, %s)",
                    (order["order_id"], order["sku"], order["qty"]),
                )
                event_id = enqueue(conn, order)
            print(f"order {order['order_id']}: committed with event {event_id}")

        # A retry of the same call (say, the COMMIT's answer was lost) finds
        # the event and returns its id: nothing new is enqueued.
        with conn.transaction():
            again = enqueue(conn, order)
        if again != event_id:
            raise SystemExit(f"retry returned event {again}, not {event_id}")
        print(f"order {order['order_id']}: retried enqueue returned event {again} again")


if __name__ == "__main__":
    main()
