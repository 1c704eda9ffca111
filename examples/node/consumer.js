// A RabbitMQ consumer of payment messages that pays each order once, however often it is delivered.
//
// Each message is {"order_id": ..., "amount": ...} with its idempotency key as the AMQP messageId.
// PostgreSQL comes from the libpq variables (PGHOST, PGPORT, PGUSER, PGDATABASE, ...), which pg
// reads too; the broker from AMQP_URL, the queue from QUEUE. tests/readme_snippets.sh runs it, kills
// it and runs it again; the part between the README markers is the Node.js snippet of README.md.
'use strict';
const amqp = require('amqplib');
const pg = require('pg');

async function main() {
  const pool = new pg.Pool({ max: 10 });
  const connection = await amqp.connect(process.env.AMQP_URL || 'amqp://guest:guest@127.0.0.1:5672');
  const channel = await connection.createChannel();
  const queue = process.env.QUEUE || 'payments';
  await channel.assertQueue(queue, { durable: true });
  await channel.prefetch(10); // up to ten handlers run at once, each on its own pooled client

  // README:begin js
  // A transaction belongs to a connection: one client from the pool per message, never one shared
  // client, or one handler's COMMIT commits another's claim before that one's payment is written.
  channel.consume(queue, async (msg) => {
    const key = msg.properties.messageId;
    const { order_id: orderId, amount } = JSON.parse(msg.content.toString());
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const { rows: [{ idem_claim: isNew }] } = await client.query("SELECT idem_claim($1, 'billing')", [key]);
      if (isNew) await client.query('INSERT INTO payments (order_id, amount) VALUES ($1, $2)', [orderId, amount]);
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {});
      client.release(err); // closed, not returned to the pool
      console.error(`payment ${key} rolled back, requeued:`, err.message);
      channel.nack(msg); // requeue: the broker delivers it again
      return;
    }
    client.release();
    channel.ack(msg); // only after COMMIT; a duplicate is acked too
  });
  // README:end js
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
