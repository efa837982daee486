"""Inventory service: reserve stock once per OrderCreated event.

Reads TOPIC with isolation.level=read_committed; for each message, one
database transaction claims the event (outbox.claim, arguments from the
message's headers) and reserves only when the claim is new; the offset is
committed after that transaction, so a crash in between redelivers the
message and the claim answers false.  Connects with the PG* variables
(PGUSER=inventory_service: EXECUTE on outbox.claim, INSERT on
reservations).  Stops after MAX_MESSAGES messages (a real service loops
for ever).

Tracing: each message's W3C traceparent header (the producer's span) is
continued as a child span, same trace id and a new span id, printed, and
put on the transaction's statements as a SQL comment in the sqlcommenter
form (/*traceparent='00-...'*/), so the database's logs and
pg_stat_activity.query tie the claim to the trace.
"""
import json
import os
import re
import secrets
import sys
import time

import psycopg
from confluent_kafka import Consumer, KafkaException

TOPIC = os.environ.get("TOPIC", "orders.python")
CONSUMER = os.environ.get("CONSUMER", "inventory-python")
MAX_MESSAGES = int(os.environ.get("MAX_MESSAGES", "5"))
TIMEOUT = float(os.environ.get("TIMEOUT", "60"))

# version-traceid-parentid-flags, lowercase hex; a later version may append
# fields (www.w3.org/TR/trace-context, "traceparent Header").
TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def nonzero_hex(nbytes):
    """A random id of nbytes as hex, never all zeros (invalid)."""
    while True:
        value = secrets.token_hex(nbytes)
        if int(value, 16):
            return value


def continue_trace(header):
    """This consumer's span: (trace id, span id, parent span id, flags).

    A child of the producer's span: its trace id and flags, a new span id.
    A missing or invalid header starts a new trace (parent None).  With
    OpenTelemetry instead: ctx = TraceContextTextMapPropagator().extract(
    headers), then tracer.start_as_current_span("reserve", context=ctx,
    kind=SpanKind.CONSUMER) around handle(); the SDK makes the span id.
    """
    m = TRACEPARENT.fullmatch(header or "")
    if (m and m[1] != "ff" and not (m[1] == "00" and m[5])
            and int(m[2], 16) and int(m[3], 16)):
        return m[2], nonzero_hex(8), m[3], m[4]
    return nonzero_hex(16), nonzero_hex(8), None, "01"


def handle(conn, headers, order, traceparent):
    """Claim and apply one message in one transaction; True if applied."""
    # sqlcommenter's form, at the end of each statement.  Spliced into the
    # SQL text, so built only from the validated hex above: never splice a
    # header as received.
    comment = f" /*traceparent='{traceparent}'*/"
    with conn.transaction():
        # event_id is decimal text in the header: cast it in the SQL.
        claimed = conn.execute(
            "SELECT outbox.claim(%s, %s::bigint, %s, %s, %s)" + comment,
            (CONSUMER, headers["event_id"], headers["biz_type"], headers["biz_key"],
             headers["outbox_source"]),
        ).fetchone()[0]
        if claimed:
            conn.execute(
                "INSERT INTO reservations (order_id, sku, qty, event_id)"
                " VALUES (%s, %s, %s, %s::bigint)" + comment,
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
                event = headers["event_id"]
                trace_id, span_id, parent_id, flags = continue_trace(headers.get("traceparent"))
                if parent_id:
                    print(f"event {event}: trace {trace_id} continued as span {span_id}"
                          f" (parent {parent_id})")
                else:
                    print(f"event {event}: no valid traceparent, new trace {trace_id}"
                          f" as span {span_id}")
                traceparent = f"00-{trace_id}-{span_id}-{flags}"
                if handle(conn, headers, json.loads(msg.value()), traceparent):
                    applied += 1
                    outcome = "applied"
                else:
                    duplicates += 1
                    outcome = "duplicate, skipped"
                # Only now, after the database committed.
                consumer.commit(message=msg, asynchronous=False)
                print(f"event {event}: {outcome}")
    finally:
        consumer.close()
    print(f"applied {applied}, duplicates {duplicates}")
    if applied + duplicates < MAX_MESSAGES:
        sys.exit(f"only {applied + duplicates} of {MAX_MESSAGES} messages within {TIMEOUT:.0f} s")


if __name__ == "__main__":
    main()
