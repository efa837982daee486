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

-- outbox.delivery takes two values; the progress topic must be a topic name.
ALTER SYSTEM SET outbox.delivery = 'exactly-once';
ALTER SYSTEM SET outbox.progress_topic = 'has space';
ALTER SYSTEM SET outbox.progress_topic = '';
-- outbox.message_format takes two shapes.
ALTER SYSTEM SET outbox.message_format = 'json';

-- A topic not created yet counts toward death only if asked: a Boolean.
ALTER SYSTEM SET outbox.missing_topic_dead = 'sometimes';

-- Relay settings: a database may have its own (ALTER DATABASE ... SET, a
-- superuser's), checked when set; the Kafka properties, which may hold
-- secrets, only cluster-wide: every role can read pg_db_role_setting.
SELECT err($$ALTER DATABASE contrib_regression SET outbox.batch_size = 0$$);
ALTER DATABASE contrib_regression SET outbox.kafka_brokers = 'localhost:9092';
ALTER DATABASE contrib_regression SET outbox.delivery = exactly_once;
ALTER DATABASE contrib_regression SET outbox.message_format = debezium;
SELECT err($$ALTER DATABASE contrib_regression SET outbox.kafka_properties = 'sasl.password=hunter2'$$);
SELECT err($$ALTER DATABASE contrib_regression SET outbox.database = 'other'$$);
SELECT split_part(c, '=', 1) AS database_setting
  FROM pg_db_role_setting, unnest(setconfig) c
 WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND c LIKE 'outbox.%' ORDER BY 1;
ALTER DATABASE contrib_regression RESET outbox.kafka_brokers;
ALTER DATABASE contrib_regression RESET outbox.delivery;
ALTER DATABASE contrib_regression RESET outbox.message_format;

-- Non-superusers can neither read nor list the Kafka properties.
CREATE ROLE outbox_reader;
SET ROLE outbox_reader;
SELECT err($$SHOW outbox.kafka_properties$$);
SELECT count(*) AS visible FROM pg_settings WHERE name = 'outbox.kafka_properties';
SELECT err($$SET outbox.max_payload_size = '10MB'$$);
SELECT err($$SET outbox.kafka_brokers = 'attacker:9092'$$);
SELECT err($$ALTER DATABASE contrib_regression SET outbox.kafka_brokers = 'attacker:9092'$$);
-- Where events go, and which topics and consumer names a role may use,
-- are a superuser's to set.
SELECT err($$SET outbox.default_topic = '__consumer_offsets'$$);
SELECT err($$SET outbox.default_topic = 'other.{biz_type}'$$);
SELECT err($$SET outbox.allowed_topics = '*'$$);
SELECT err($$SET outbox.allowed_consumers = ''$$);
SHOW outbox.allowed_topics;
RESET ROLE;
DROP ROLE outbox_reader;

-- The allowed lists are checked when set: comma-separated names, a
-- trailing "*" for a prefix, blanks around entries ignored.
SET outbox.allowed_topics = ' orders.* , billing,payments ';
SHOW outbox.allowed_topics;
SET outbox.allowed_topics = '*';
SELECT err($$SET outbox.allowed_topics = 'orders,,billing'$$);
SELECT err($$SET outbox.allowed_topics = 'orders,'$$);
SELECT err($$SET outbox.allowed_topics = 'bad topic'$$);
SELECT err($$SET outbox.allowed_topics = 'or*ders'$$);
SELECT regexp_replace(err(format('SET outbox.allowed_topics = %L', repeat('t', 250))), 't{250}', 't...t');
SET outbox.allowed_consumers = 'inventory, billing-*, ключ';
SELECT err($$SET outbox.allowed_consumers = 'a*b'$$);
SELECT regexp_replace(err(format('SET outbox.allowed_consumers = %L', repeat('c', 257))), 'c{257}', 'c...c');
RESET outbox.allowed_topics;
RESET outbox.allowed_consumers;
