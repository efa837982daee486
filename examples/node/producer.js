// Order service: each order and its OrderCreated event in one transaction.
//
// Connects with libpq's PG* variables (PGUSER=order_service: EXECUTE on
// outbox.enqueue and INSERT on orders, nothing else); TOPIC, ORDER_PREFIX
// and ORDERS say where and how many.
'use strict';
const { Client } = require('pg');

const TOPIC = process.env.TOPIC || 'orders.node';
const PREFIX = process.env.ORDER_PREFIX || 'node';
const ORDERS = Number(process.env.ORDERS || 5);

// JSON text from JSON.stringify, cast in the SQL: node-postgres would turn
// a JS array into a PostgreSQL array literal, not JSON.
const ENQUEUE = `
  SELECT outbox.enqueue(biz_type => $1, biz_key => $2, payload => $3::jsonb,
                        topic => $4, headers => $5::jsonb) AS id`;

// enqueue adds the order's event in the client's transaction; bigint comes
// back from node-postgres as a string, which is what an id should stay.
async function enqueue(client, order) {
  const { rows } = await client.query(ENQUEUE, [
    'OrderCreated', order.order_id, JSON.stringify(order), TOPIC,
    JSON.stringify({ source: 'node-example' }),
  ]);
  return rows[0].id;
}

// inTransaction runs fn between BEGIN and COMMIT, ROLLBACK if it throws.
async function inTransaction(client, fn) {
  await client.query('BEGIN');
  try {
    const result = await fn();
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  }
}

async function main() {
  const client = new Client(); // the PG* variables
  await client.connect();
  try {
    let order;
    let eventId;
    for (let i = 1; i <= ORDERS; i++) {
      order = { order_id: `${PREFIX}-${i}`, sku: 'sku-red', qty: i };
      eventId = await inTransaction(client, async () => {
        await client.query('INSERT INTO orders (id, sku, qty) VALUES ($1, $2, $3)',
          [order.order_id, order.sku, order.qty]);
        return enqueue(client, order);
      });
      console.log(`order ${order.order_id}: committed with event ${eventId}`);
    }

    // A retry of the same call (say, the COMMIT's answer was lost) finds
    // the event and returns its id: nothing new is enqueued.
    const again = await inTransaction(client, () => enqueue(client, order));
    if (again !== eventId) throw new Error(`retry returned event ${again}, not ${eventId}`);
    console.log(`order ${order.order_id}: retried enqueue returned event ${again} again`);
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
