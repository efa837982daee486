// Inventory service: reserve stock once per OrderCreated event.
//
// Reads TOPIC read_committed (kafkajs's default, readUncommitted: false);
// for each message, one database transaction claims the event
// (outbox.claim, arguments from the message's headers) and reserves only
// when the claim is new; the offset is committed after that transaction,
// so a crash in between redelivers the message and the claim answers
// false.  Connects with the PG* variables (PGUSER=inventory_service:
// EXECUTE on outbox.claim, INSERT on reservations) and stops after
// MAX_MESSAGES messages (a real service runs for ever).
'use strict';
const { Client } = require('pg');
const { Kafka, logLevel } = require('kafkajs');

const TOPIC = process.env.TOPIC || 'orders.node';
const CONSUMER = process.env.CONSUMER || 'inventory-node';
const MAX_MESSAGES = Number(process.env.MAX_MESSAGES || 5);
const TIMEOUT_MS = Number(process.env.TIMEOUT || 60) * 1000;

// handle claims and applies one message in one transaction; true if applied.
async function handle(db, message) {
  const h = Object.fromEntries(
    Object.entries(message.headers).map(([name, value]) => [name, value.toString()]));
  const order = JSON.parse(message.value.toString());
  await db.query('BEGIN');
  try {
    // event_id is decimal text in the header: cast it in the SQL.
    const { rows } = await db.query('SELECT outbox.claim($1, $2::bigint, $3, $4, $5) AS claimed',
      [CONSUMER, h.event_id, h.biz_type, h.biz_key, h.outbox_source]);
    if (rows[0].claimed) {
      await db.query(`INSERT INTO reservations (order_id, sku, qty, event_id)
                      VALUES ($1, $2, $3, $4::bigint)`,
      [order.order_id, order.sku, order.qty, h.event_id]);
    }
    await db.query('COMMIT');
    return { claimed: rows[0].claimed, eventId: h.event_id };
  } catch (err) {
    await db.query('ROLLBACK');
    throw err;
  }
}

async function main() {
  const kafka = new Kafka({
    clientId: 'inventory-node',
    brokers: (process.env.KAFKA_BROKERS || 'localhost:9092').split(','),
    logLevel: logLevel.WARN,
  });
  const consumer = kafka.consumer({
    groupId: process.env.GROUP_ID || 'inventory-node',
    readUncommitted: false, // isolation.level=read_committed
  });
  const db = new Client(); // the PG* variables
  await db.connect();
  await consumer.connect();
  await consumer.subscribe({ topic: TOPIC, fromBeginning: true });

  let applied = 0;
  let duplicates = 0;
  let failure = null;
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const timer = setTimeout(finish, TIMEOUT_MS);
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ topic, partition, message }) => {
      if (applied + duplicates >= MAX_MESSAGES) return;
      let result;
      try {
        result = await handle(db, message);
      } catch (err) {
        failure = err; // not committed: the message comes again
        finish();
        return;
      }
      if (result.claimed) applied++; else duplicates++;
      // Only now, after the database committed.
      await consumer.commitOffsets([
        { topic, partition, offset: (BigInt(message.offset) + 1n).toString() },
      ]);
      console.log(`event ${result.eventId}: ${result.claimed ? 'applied' : 'duplicate, skipped'}`);
      if (applied + duplicates >= MAX_MESSAGES) finish();
    },
  });
  await finished;
  clearTimeout(timer);
  await consumer.disconnect();
  await db.end();
  if (failure) throw failure;
  console.log(`applied ${applied}, duplicates ${duplicates}`);
  if (applied + duplicates < MAX_MESSAGES) {
    throw new Error(`only ${applied + duplicates} of ${MAX_MESSAGES} messages within ${TIMEOUT_MS / 1000} s`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
