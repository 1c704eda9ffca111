// The README's Node.js snippet before the fix, for showing that tests/readme_snippets.sh catches it:
// one pg.Client shared by amqplib's concurrent handlers (columns named, so that only the sharing is
// wrong). One handler's COMMIT commits the claims that the others made on the same connection,
// before their payments are written; killed then, those payments are lost: redelivered, the claim
// answers false. Run: NODE_CONSUMER=tests/readme_snippets/node_shared_client.js bash tests/readme_snippets.sh
'use strict';
const amqp = require('amqplib');
const pg = require('pg');

async function main() {
  const client = new pg.Client();
  await client.connect();
  const connection = await amqp.connect(process.env.AMQP_URL || 'amqp://guest:guest@127.0.0.1:5672');
  const channel = await connection.createChannel();
  const queue = process.env.QUEUE || 'payments';
  await channel.assertQueue(queue, { durable: true });
  await channel.prefetch(10);
  channel.consume(queue, async (msg) => {
    const key = msg.properties.messageId;
    const { order_id: orderId, amount } = JSON.parse(msg.content.toString());
    await client.query('BEGIN');
    const { rows: [{ idem_claim: isNew }] } = await client.query("SELECT idem_claim($1, 'billing')", [key]);
    if (isNew) await client.query('INSERT INTO payments (order_id, amount) VALUES ($1, $2)', [orderId, amount]);
    await client.query('COMMIT');
    channel.ack(msg);
  });
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
