"""Inventory service: reserve stock once per OrderCreated event.

Reads TOPIC with isolation.level=read_committed; for each message, one
database transaction claims the event (outbox.claim, arguments from the
message's headers) and reserves only when the claim is new; the offset is
committed after that transaction, so a crash in between redelivers the
message and the claim answers false.  Connects with the PG* variables
(PGUSER=inventory_service: EXECUTE on outbox.claim, INSERT on
reservations).  Stops after MAX_MESSAGES messages (a real service loops
for ever).
"""
import json
import os
import sys
import time

import psycopg
from confluent_kafka import Consumer, KafkaException

TOPIC = os.environ.get("TOPIC", "orders.python")
CONSUMER = os.environ.get("CONSUMER", "inventory-python")
MAX_MESSAGES = int(os.environ.get("MAX_MESSAGES", "5"))
TIMEOUT = float(os.environ.get("TIMEOUT", "60"))


def handle(conn, headers, order):
    """Claim and apply one message in one transaction; True if applied."""
    with conn.transaction():
        # event_id is decimal text in the header: cast it in the SQL.
        claimed = conn.execute(
            "SELECT outbox.claim(%s, %s::bigint, %s, %s)",
            (CONSUMER, headers["event_id"], headers["biz_type"], headers["biz_key"]),
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
        "group.id": os.environ.get("GROUP_ID", "inventory-python"),
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
                if handle(conn, headers, json.loads(msg.value())):
                    applied += 1
                    outcome = "applied"
                else:
                    duplicates += 1
                    outcome = "duplicate, skipped"
                # Only now, after the database committed.
                consumer.commit(message=msg, asynchronous=False)
                print(f"event {headers['event_id']}: {outcome}")
    finally:
        consumer.close()
    print(f"applied {applied}, duplicates {duplicates}")
    if applied + duplicates < MAX_MESSAGES:
        sys.exit(f"only {applied + duplicates} of {MAX_MESSAGES} messages within {TIMEOUT:.0f} s")


if __name__ == "__main__":
    main()
