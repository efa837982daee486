-- Settings: defaults, checks at set time, and secrets kept from non-superusers.
LOAD 'outbox';

SELECT name, setting, unit, context
  FROM pg_settings WHERE name LIKE 'outbox.%' ORDER BY name;

-- librdkafka properties are checked when set; the error names the key only.
-- (ALTER SYSTEM cannot run inside err(), so psql shows these errors.)
ALTER SYSTEM SET outbox.kafka_properties = 'no.such.property=secret-value';
ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms';
ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms=not-a-number';
ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms=2; compression.type=lz4;';
ALTER SYSTEM RESET outbox.kafka_properties;

-- Relay settings take effect on reload, not per session.
SELECT err($$SET outbox.kafka_brokers = 'localhost:9092'$$);
SELECT err($$SET outbox.batch_size = 0$$);

-- Non-superusers can neither read nor list the Kafka properties.
CREATE ROLE outbox_reader;
SET ROLE outbox_reader;
SELECT err($$SHOW outbox.kafka_properties$$);
SELECT count(*) AS visible FROM pg_settings WHERE name = 'outbox.kafka_properties';
SELECT err($$SET outbox.max_payload_size = '10MB'$$);
RESET ROLE;
DROP ROLE outbox_reader;
