"""Order service: each order and its OrderCreated event in one transaction.

Connects with libpq's PG* variables (PGUSER=order_service: EXECUTE on
outbox.enqueue and INSERT on orders, nothing else).  TOPIC, ORDER_PREFIX
and ORDERS say where and how many.

Each event carries a W3C traceparent header, the order's trace, which the
relay passes through to Kafka like any header of the event's own; the
consumer continues the trace from it.
"""
import json
import os
import secrets

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


def new_traceparent():
    """A W3C traceparent (www.w3.org/TR/trace-context) for a new trace:
    version 00, a random 16-byte trace id, a random 8-byte id of this
    service's span (the consumer's parent), flags 01 (sampled).

    With OpenTelemetry, the current span's context goes into the headers
    instead: TraceContextTextMapPropagator().inject(headers_dict) (from
    opentelemetry.trace.propagation.tracecontext) writes "traceparent"
    (and "tracestate" when there is one) into the dict enqueued below.
    """
    while True:
        trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
        if int(trace_id, 16) and int(span_id, 16):  # all zeros is invalid
            return f"00-{trace_id}-{span_id}-01"


def enqueue(conn, order, traceparent):
    """Enqueue the order's event in conn's transaction; return its id."""
    payload = json.dumps(order)
    # The headers are part of the event's content: a retry must send the
    # same traceparent (keep it with the order) or get 23505.
    headers = json.dumps({"source": "python-example", "traceparent": traceparent})
    row = conn.execute(
        ENQUEUE, ("OrderCreated", order["order_id"], payload, TOPIC, headers)
    ).fetchone()
    return row[0]


def main():
    with psycopg.connect(autocommit=True) as conn:
        for i in range(1, ORDERS + 1):
            order = {"order_id": f"{PREFIX}-{i}", "sku": "sku-red", "qty": i}
            traceparent = new_traceparent()
            with conn.transaction():  # BEGIN ... COMMIT (ROLLBACK on error)
                conn.execute(
                    "INSERT INTO orders (id, sku, qty) VALUES (%s, %s, %s)",
                    (order["order_id"], order["sku"], order["qty"]),
                )
                event_id = enqueue(conn, order, traceparent)
            print(f"order {order['order_id']}: committed with event {event_id},"
                  f" traceparent {traceparent}")

        # A retry of the same call (say, the COMMIT's answer was lost) finds
        # the event and returns its id: nothing new is enqueued.
        with conn.transaction():
            again = enqueue(conn, order, traceparent)
        if again != event_id:
            raise SystemExit(f"retry returned event {again}, not {event_id}")
        print(f"order {order['order_id']}: retried enqueue returned event {again} again")


if __name__ == "__main__":
    main()
