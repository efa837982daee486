"""Inventory service, Avro: reserve stock once per OrderCreated event whose
value is Avro in the schema registry's wire format.

As the JSON consumer (../python/consumer.py): isolation.level=
read_committed; per message, one database transaction claims the event
(outbox.claim, arguments from the headers) and reserves only when the claim
is new; the offset is committed after that transaction.  Before that it
checks the content-type header, the magic byte and the schema id, and
decodes the Avro body (wire.py).  A value that fails is a poison message:
this example stops with an error; a real service would park it in a
dead-letter topic and commit past it.  Each line names the value's sha256,
which the examples' check compares with outbox.event_log.payload_bytes.
Connects with the PG* variables (PGUSER=inventory_service).  Stops after
MAX_MESSAGES messages.
"""
import hashlib
import os
import sys
import time

import psycopg
from confluent_kafka import Consumer, KafkaException

import wire

TOPIC = os.environ.get("TOPIC", "orders.python_avro")
CONSUMER = os.environ.get("CONSUMER", "inventory-python_avro")
MAX_MESSAGES = int(os.environ.get("MAX_MESSAGES", "5"))
TIMEOUT = float(os.environ.get("TIMEOUT", "60"))


def handle(conn, headers, order):
    """Claim and apply one message in one transaction; True if applied."""
    with conn.transaction():
        # event_id is decimal text in the header: cast it in the SQL.
        claimed = conn.execute(
            "SELECT outbox.claim(%s, %s::bigint, %s, %s, %s)",
            (CONSUMER, headers["event_id"], headers["biz_type"], headers["biz_key"],
             headers["outbox_source"]),
        ).fetchone()[0]
        if claimed:
            conn.execute(
                "INSERT INTO reservations (order_id, sku, qty, event_id)"
                " VALUES (%s, %s, %s, %s::bigint)",
                (order["order_id"], order["sku"], order["qty"], headers["event_id"]),
            )
    return claimed


def main():
    consumer = Consumer({
        "bootstrap.servers": os.environ.get("KAFKA_BROKERS", "localhost:9092"),
        "group.id": os.environ.get("GROUP_ID", "inventory-python_avro"),
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    consumer.subscribe([TOPIC])
    applied = duplicates = 0
    deadline = time.monotonic() + TIMEOUT
    try:
        with psycopg.connect(autocommit=True) as conn:
            while applied + duplicates < MAX_MESSAGES and time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                if msg.error():
                    raise KafkaException(msg.error())
                headers = {name: value.decode() for name, value in msg.headers() or []}
                value = msg.value() or b""
                event = headers["event_id"]
                if headers.get("content-type") != wire.CONTENT_TYPE:
                    sys.exit(f"event {event}: content-type {headers.get('content-type')!r},"
                             f" want {wire.CONTENT_TYPE!r}")
                try:
                    order = wire.decode(value)
                except ValueError as e:
                    sys.exit(f"event {event}: {e}")
                if order["order_id"] != headers["biz_key"]:
                    sys.exit(f"event {event}: order {order['order_id']} under key {headers['biz_key']}")
                if handle(conn, headers, order):
                    applied += 1
                    outcome = "applied"
                else:
                    duplicates += 1
                    outcome = "duplicate, skipped"
                # Only now, after the database committed.
                consumer.commit(message=msg, asynchronous=False)
                print(f"event {event}: {outcome}, {order['order_id']} qty {order['qty']},"
                      f" value sha256 {hashlib.sha256(value).hexdigest()}")
    finally:
        consumer.close()
    print(f"applied {applied}, duplicates {duplicates}")
    if applied + duplicates < MAX_MESSAGES:
        sys.exit(f"only {applied + duplicates} of {MAX_MESSAGES} messages within {TIMEOUT:.0f} s")


if __name__ == "__main__":
    main()
