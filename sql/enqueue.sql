-- outbox.enqueue(): insert, idempotency, routing defaults, input errors.

-- A first event: the row has the arguments and the defaults.
SELECT outbox.enqueue('OrderCreated', 'order-1', '{"order_id": 1, "total": 9.5}') AS first_id \gset
SELECT id = :first_id AS same_id, biz_type, biz_key, topic, msg_key, payload,
       headers, status, attempts, last_error, next_attempt_at = created_at AS due_now
  FROM outbox.events;
-- The row carries the top-level transaction id, also from a savepoint.
BEGIN;
SAVEPOINT sp;
SELECT outbox.enqueue('OrderCreated', 'order-tx', '{}') AS tx_id \gset
SELECT tx = pg_current_xact_id() AS tx_is_top_level
  FROM outbox.event_log WHERE id = :tx_id;
COMMIT;

-- Named arguments, explicit topic, headers and msg_key.
SELECT outbox.enqueue(biz_type => 'PaymentSucceeded', biz_key => 'pay-7',
                      payload => '{"amount": 100}', topic => 'payments',
                      headers => '{"traceparent": "00-abc-def-01"}',
                      msg_key => 'order-1') > :first_id AS later_id;
SELECT biz_type, topic, msg_key, headers FROM outbox.events WHERE biz_key = 'pay-7';

-- Retry with the same content: same id, no new row.
SELECT outbox.enqueue('OrderCreated', 'order-1', '{"total": 9.5, "order_id": 1}') = :first_id AS retry_same_id;
SELECT outbox.enqueue('OrderCreated', 'order-1', '{"order_id": 1, "total": 9.5}',
                      topic => 'outbox.event.OrderCreated', msg_key => 'order-1') = :first_id AS explicit_defaults_same_id;
SELECT count(*) FROM outbox.event_log WHERE biz_type = 'OrderCreated';

-- No headers, spelled NULL or '{}' (drivers send either): one event,
-- stored as NULL, whichever way the first call and the retry spell it;
-- a row stored with '{}' before 0.3.0 matches both too.
SELECT outbox.enqueue('T', 'hdr-none', '{}', headers => '{}') AS none_id \gset
SELECT headers IS NULL AS stored_as_null FROM outbox.event_log WHERE id = :none_id;
SELECT outbox.enqueue('T', 'hdr-none', '{}') = :none_id AS null_retry_same_id;
SELECT outbox.enqueue('T', 'hdr-null', '{}') AS null_id \gset
SELECT outbox.enqueue('T', 'hdr-null', '{}', headers => '{}') = :null_id AS empty_retry_same_id;
UPDATE outbox.event_log SET headers = '{}' WHERE id = :null_id;
SELECT outbox.enqueue('T', 'hdr-null', '{}') = :null_id AS old_empty_null_retry,
       outbox.enqueue('T', 'hdr-null', '{}', headers => '{}') = :null_id AS old_empty_empty_retry;
SELECT err($$SELECT outbox.enqueue('T', 'hdr-null', '{}', headers => '{"a": "b"}')$$);
SELECT err($$SELECT outbox.enqueue('T', 'hdr-none', '{}', headers => '{"a": "b"}')$$);

-- Same key, different content: 23505, and nothing changes.
SELECT err($$SELECT outbox.enqueue('OrderCreated', 'order-1', '{"order_id": 1, "total": 10}')$$);
SELECT err($$SELECT outbox.enqueue('OrderCreated', 'order-1', '{"order_id": 1, "total": 9.5}', topic => 'other')$$);
SELECT err($$SELECT outbox.enqueue('OrderCreated', 'order-1', '{"order_id": 1, "total": 9.5}', headers => '{"a": "b"}')$$);
SELECT err($$SELECT outbox.enqueue('OrderCreated', 'order-1', '{"order_id": 1, "total": 9.5}', msg_key => 'k')$$);
SELECT count(*), min(payload::text) FROM outbox.event_log WHERE biz_type = 'OrderCreated';

-- Rolled back: the event never existed.
BEGIN;
SELECT outbox.enqueue('OrderCreated', 'order-rolled-back', '{}') IS NOT NULL AS enqueued;
ROLLBACK;
SELECT count(*) FROM outbox.events WHERE biz_key = 'order-rolled-back';

-- A failed statement in a savepoint leaves no event either.
BEGIN;
SAVEPOINT s;
SELECT outbox.enqueue('OrderCreated', 'order-savepoint', '{}') IS NOT NULL AS enqueued;
ROLLBACK TO s;
COMMIT;
SELECT count(*) FROM outbox.events WHERE biz_key = 'order-savepoint';

-- Default topic routing follows outbox.default_topic.
SHOW outbox.default_topic;
SET outbox.default_topic = 'shop.{biz_type}.v1.{biz_type}';
SELECT outbox.enqueue('StockReserved', 'sku-1', '1') AS id \gset
SELECT topic FROM outbox.events WHERE id = :id;
SET outbox.default_topic = 'all-events';
SELECT outbox.enqueue('StockReserved', 'sku-2', '"x"') AS id \gset
SELECT topic FROM outbox.events WHERE id = :id;
SELECT err($$SET outbox.default_topic = 'bad topic {biz_type}'$$);
RESET outbox.default_topic;
-- A biz_type that makes an illegal topic asks for an explicit one.
SELECT err($$SELECT outbox.enqueue('Order Created', 'k', '{}')$$);
SELECT outbox.enqueue('Order Created', 'k', '{}', topic => 'orders') IS NOT NULL AS explicit_topic_ok;

-- NULL and empty required arguments.
SELECT err($$SELECT outbox.enqueue(NULL, 'k', '{}')$$);
SELECT err($$SELECT outbox.enqueue('T', NULL, '{}')$$);
SELECT err($$SELECT outbox.enqueue('T', 'k', NULL)$$);
SELECT err($$SELECT outbox.enqueue('', 'k', '{}')$$);
SELECT err($$SELECT outbox.enqueue('T', '', '{}')$$);
SELECT err($$SELECT outbox.enqueue('T', 'k', '{}', msg_key => '')$$);
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L)', 'T', repeat('k', 1025), '{}'));
SELECT outbox.enqueue('T', repeat('k', 1024), '{}') IS NOT NULL AS longest_key_ok;

-- Topic names Kafka refuses.
SELECT err($$SELECT outbox.enqueue('T', 'k', '{}', topic => '')$$);
SELECT err($$SELECT outbox.enqueue('T', 'k', '{}', topic => '.')$$);
SELECT err($$SELECT outbox.enqueue('T', 'k', '{}', topic => '..')$$);
SELECT err($$SELECT outbox.enqueue('T', 'k', '{}', topic => 'a/b')$$);
SELECT err($$SELECT outbox.enqueue('T', 'k', '{}', topic => 'caf' || chr(233))$$);
SELECT regexp_replace(err(format('SELECT outbox.enqueue(%L, %L, %L, topic => %L)', 'T', 'k', '{}', repeat('t', 250))), 't{250}', 't...t');
SELECT outbox.enqueue('T', 'k249', '{}', topic => repeat('t', 249)) IS NOT NULL AS longest_topic_ok;
-- A name far too long is shown in part.
SELECT regexp_replace(err(format('SELECT outbox.enqueue(%L, %L, %L, topic => %L)', 'T', 'k', '{}', repeat('ab', 200) || ' x')), '(ab)+', 'abab', 'g');
SELECT outbox.enqueue('T', 'k-dots', '{}', topic => '...') IS NOT NULL AS three_dots_ok;
-- Kafka's internal topics ("__consumer_offsets", "__transaction_state")
-- are no producer's to write, given or from outbox.default_topic.
SELECT err($$SELECT outbox.enqueue('T', 'k', '{}', topic => '__consumer_offsets')$$);
SELECT err($$SELECT outbox.enqueue('T', 'k', '{}', topic => '__')$$);
SELECT err($$SET outbox.default_topic = '__{biz_type}'$$);
SET outbox.default_topic = '{biz_type}';
SELECT err($$SELECT outbox.enqueue('__transaction_state', 'k', '{}')$$);
RESET outbox.default_topic;
SELECT outbox.enqueue('T', 'k-underscore', '{}', topic => '_schemas') IS NOT NULL AS one_underscore_ok;
SELECT outbox.enqueue('T', 'k-inner', '{}', topic => 'a__b') IS NOT NULL AS inner_underscores_ok;

-- Size limit: what librdkafka counts of a message, the payload as compact
-- JSON text, the message key, the header names and values with their
-- lengths (one byte each here), and the relay's own: 36 bytes of framing,
-- event_id (29 bytes at most), biz_type and biz_key (names, values and
-- two bytes each), outbox_source (68): 158 for biz_type 'T' and a biz_key
-- of 5 bytes.
SET outbox.max_payload_size = '222B';
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L)', 'T', 'big', json_build_object('s', repeat('x', 60))));
SELECT outbox.enqueue('T', 'fits', json_build_object('s', repeat('x', 50))::jsonb) IS NOT NULL AS fits;
-- Exactly at the limit fits (59 bytes of payload, a key of 5, 141 more);
-- escaping counts (a control character takes six bytes).
SELECT outbox.enqueue('T', 'exact', json_build_object('s', repeat('x', 51))::jsonb) IS NOT NULL AS exact_fits;
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L)', 'T', 'escaped', json_build_object('s', repeat(chr(1), 10))));
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L)', 'T', 'one-over', json_build_object('s', repeat('x', 46))));
-- In Debezium's shape (the session's outbox.message_format, as a
-- database's setting gives it) the value is jsonb's text, a space after
-- each colon and comma: a payload exactly at the limit as compact JSON is
-- one byte over.
SET outbox.message_format = debezium;
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L)', 'T', 'dbz-a', json_build_object('s', repeat('x', 51))));
SELECT outbox.enqueue('T', 'dbz-b', json_build_object('s', repeat('x', 50))::jsonb) IS NOT NULL AS debezium_exact_fits;
RESET outbox.message_format;
-- The key that counts is msg_key when given (biz_key counts as a header).
SELECT outbox.enqueue('T', 'exact-mk', json_build_object('s', repeat('x', 48))::jsonb,
                      msg_key => 'exact') IS NOT NULL AS exact_msg_key_fits;
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L, msg_key => %L)', 'T', 'mk-over1',
                  json_build_object('s', repeat('x', 48)), 'exact1'));
-- Header names and values count: 2 + 2 + (1 + 1 + 60 + 1) + 87 bytes
-- fit, one more not.
SELECT outbox.enqueue('T', 'hd', '{}', headers => jsonb_build_object('n', repeat('v', 60))) IS NOT NULL AS header_fits;
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L, headers => %L)', 'T', 'hd-over', '{}',
                  jsonb_build_object('n', repeat('v', 51))));
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L, headers => %L)', 'T', 'hn-over', '{}',
                  jsonb_build_object(repeat('n', 52), '')));
RESET outbox.max_payload_size;
SHOW outbox.max_payload_size;
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L)', 'T', 'huge', json_build_object('s', repeat('x', 1048576))));
-- A 5 MB header value with a small payload: refused here, not by the broker.
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L, headers => %L)', 'T', 'huge-header', '{}',
                  jsonb_build_object('trace', repeat('v', 5 * 1024 * 1024))));
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L, headers => %L)', 'T', 'many-headers', '{}',
                  (SELECT jsonb_object_agg('h' || i, repeat('v', 20000)) FROM generate_series(1, 60) i)));

-- Headers: a flat object of strings, no reserved names.
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => '["a"]')$$);
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => '"text"')$$);
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => 'null')$$);
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => '{"n": 1}')$$);
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => '{"n": null}')$$);
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => '{"n": {"deep": "x"}}')$$);
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => '{"": "x"}')$$);
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => '{"event_id": "1"}')$$);
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => '{"Biz_Type": "x"}')$$);
SELECT err($$SELECT outbox.enqueue('T', 'h', '{}', headers => '{"ok": "1", "biz_key": "x"}')$$);
SELECT err(format('SELECT outbox.enqueue(%L, %L, %L, headers => %L)', 'T', 'h', '{}',
                  (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 62) i)));
SELECT outbox.enqueue('T', 'h61', '{}', headers => (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 61) i)) IS NOT NULL AS most_headers_ok;
SELECT outbox.enqueue('T', 'h', '{}', headers => '{}') IS NOT NULL AS empty_headers_ok;
SELECT outbox.enqueue('T', 'h2', '{}', headers => '{"event_ids": "x", "trace": ""}') IS NOT NULL AS near_names_ok;

-- None of the rejected calls left a row.
SELECT biz_type, left(biz_key, 8) AS biz_key, length(biz_key) FROM outbox.event_log
 WHERE biz_type = 'T' ORDER BY biz_key COLLATE "C";
-- A retry that finds its event writes WAL (it locks the event), so its
-- COMMIT waits for a synchronous standby as the first one did.
SELECT outbox.enqueue('T', 'wal-check', '{}') IS NOT NULL AS first;
BEGIN;
SELECT pg_current_wal_insert_lsn() AS before \gset
SELECT outbox.enqueue('T', 'wal-check', '{}') = (SELECT id FROM outbox.event_log WHERE biz_key = 'wal-check') AS same_id;
SELECT pg_current_wal_insert_lsn() > :'before' AS wrote_wal;
COMMIT;

-- enqueue_bytes: the payload as bytes (Avro, Protobuf, signed bytes), kept
-- and sent as they are; every other rule is enqueue's.
SELECT outbox.enqueue_bytes('Raw', 'b-1', '\x00000000010203ff', topic => 'raw') AS bytes_id \gset
SELECT payload IS NULL AS no_json, payload_bytes, topic, msg_key, status
  FROM outbox.events WHERE id = :bytes_id;
SELECT outbox.enqueue_bytes('Raw', 'b-1', '\x00000000010203ff', topic => 'raw') = :bytes_id AS retry_same_id;
SELECT outbox.enqueue_bytes('Raw', 'b-1', '\x00000000010203ff', topic => 'raw', headers => '{}') = :bytes_id AS retry_empty_headers_same_id;
-- Other bytes, or the same key as JSON, is another event: 23505.
SELECT err($$SELECT outbox.enqueue_bytes('Raw', 'b-1', '\x00', topic => 'raw')$$);
SELECT err($$SELECT outbox.enqueue('Raw', 'b-1', 'null', topic => 'raw')$$);
SELECT outbox.enqueue('Raw', 'j-1', '{}') IS NOT NULL AS json_first;
SELECT err($$SELECT outbox.enqueue_bytes('Raw', 'j-1', convert_to('{}', 'UTF8'))$$);
-- Empty bytes are an empty value; NULL is refused.
SELECT outbox.enqueue_bytes('Raw', 'b-empty', '') IS NOT NULL AS empty_ok;
SELECT err($$SELECT outbox.enqueue_bytes('Raw', 'b-null', NULL)$$);
SELECT err($$SELECT outbox.enqueue_bytes('Raw', '', '\x00')$$);
SELECT err($$SELECT outbox.enqueue_bytes('Raw', 'b-2', '\x00', topic => 'a/b')$$);
SELECT err($$SELECT outbox.enqueue_bytes('Raw', 'b-2', '\x00', headers => '{"event_id": "1"}')$$);
-- Size counts the bytes as they are, with the key and headers.
SET outbox.max_payload_size = '222B';
SELECT outbox.enqueue_bytes('Raw', 'b-exact', decode(repeat('00', 53), 'hex')) IS NOT NULL AS exact_fits;
SELECT err(format('SELECT outbox.enqueue_bytes(%L, %L, %L::bytea)', 'Raw', 'b-over', decode(repeat('00', 56), 'hex')));
SELECT err(format('SELECT outbox.enqueue_bytes(%L, %L, %L::bytea, headers => %L)', 'Raw', 'b-hd', '\x00',
                  jsonb_build_object('n', repeat('v', 60))));
RESET outbox.max_payload_size;
-- A row holds one payload, JSON or bytes: the table refuses both and neither.
-- (The message only: the detail shows the row, ids and time.)
SELECT split_part(err($$INSERT INTO outbox.event_log (biz_type, biz_key, topic, msg_key, payload, payload_bytes)
                        VALUES ('Raw', 'both', 't', 'k', '{}', '\x00')$$), E'\n', 1) AS both_refused;
SELECT split_part(err($$INSERT INTO outbox.event_log (biz_type, biz_key, topic, msg_key)
                        VALUES ('Raw', 'neither', 't', 'k')$$), E'\n', 1) AS neither_refused;
SELECT biz_key, payload, length(payload_bytes) AS bytes FROM outbox.event_log
 WHERE biz_type = 'Raw' ORDER BY id;
