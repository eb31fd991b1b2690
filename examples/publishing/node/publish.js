// Publish an order's event in the same transaction as the order itself.
//
//   DATABASE_URL=postgres://app@db/shop node publish.js 1042 order.created [rollback]
'use strict';

const { Client } = require('pg');

async function publish(orderId, type, rollback) {
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    await client.query('BEGIN');
    const total = 19.99;
    await client.query('INSERT INTO orders (id, total) VALUES ($1, $2)', [orderId, total]);
    // Stringified here, and cast in SQL: node-postgres would turn an array
    // into a Postgres array literal, and the cast says what the text is.
    const data = JSON.stringify({ order_id: orderId, total });
    // The id is the order's own, so a retry after a lost COMMIT cannot publish it twice.
    // The ordering key is the order: each endpoint gets its events one at
    // a time, in the order their transactions commit.
    const { rows: [row] } = await client.query(
      `SELECT event_id, error_code, error_field, error_message
         FROM hooklane_try_publish_v3(tenant => 'acme', type => $1, data => $2::jsonb, id => $3,
                                      ordering_key => $4)`,
      [type, data, `order-${orderId}-created`, `order-${orderId}`],
    );
    if (row.error_code) {
      console.error(`refused ${row.error_code} ${row.error_field}: ${row.error_message}`);
      // A refusal comes back as a row, not an error: the transaction is
      // still usable, and the order commits without its event.
      await client.query('COMMIT');
      return 2;
    }
    await client.query(rollback ? 'ROLLBACK' : 'COMMIT');
    console.log(row.event_id);
    return 0;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    await client.end();
  }
}

const [orderId, type, finish, ...rest] = process.argv.slice(2);
if (!orderId || !type || (finish !== undefined && finish !== 'rollback') || rest.length) {
  console.error('usage: node publish.js ORDER_ID EVENT_TYPE [rollback]');
  process.exit(1);
}
publish(orderId, type, finish === 'rollback').then(
  (status) => { process.exitCode = status; },
  (err) => { console.error(err.message); process.exitCode = 1; },
);
