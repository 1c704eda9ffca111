"""A NATS JetStream consumer of payment messages that pays each order once, however often it arrives.

Each message is {"order_id": ..., "amount": ...}. Unlike the RabbitMQ consumers, this one claims
the business key, idem_key('payment', order_id), not the message id: a backfill that publishes
the same orders again under new message ids (Nats-Msg-Id) is then recognised too.
PostgreSQL comes from the libpq variables, NATS from NATS_URL; it binds to the durable push
consumer DURABLE of stream STREAM, made by whoever runs it with the AckWait they choose. Messages
are handled one at a time, in order. make e2e runs it.
"""
import asyncio
import json
import logging
import os

import nats
import psycopg

log = logging.getLogger("nats_consumer")


async def handle(conn, msg):
    payment = json.loads(msg.data)
    try:
        async with conn.transaction():  # BEGIN; COMMIT at the end of the block, ROLLBACK on an exception
            cur = await conn.execute("SELECT idem_claim(idem_key('payment', %s), 'billing')",
                                     (payment["order_id"],))
            if (await cur.fetchone())[0]:
                await conn.execute("INSERT INTO payments (order_id, amount) VALUES (%s, %s)",
                                   (payment["order_id"], payment["amount"]))
    except Exception:
        log.exception("payment %s rolled back; JetStream delivers it again", payment.get("order_id"))
        await msg.nak()
        return
    await msg.ack()  # only after COMMIT: a duplicate is acked too


async def main():
    logging.basicConfig(level=logging.INFO)
    conn = await psycopg.AsyncConnection.connect(autocommit=True)  # so that transaction() is BEGIN ... COMMIT
    broker = await nats.connect(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    js = broker.jetstream()
    stream, durable = os.environ["STREAM"], os.environ["DURABLE"]
    info = await js.consumer_info(stream, durable)

    broken = asyncio.Event()

    async def on_message(msg):
        await handle(conn, msg)
        if conn.broken:  # nats-py swallows what a callback raises, so the loop below exits
            broken.set()

    await js.subscribe_bind(stream, info.config, durable, cb=on_message, manual_ack=True)
    await broken.wait()
    # The server is gone (a restart, a failover): exit, a supervisor restarts us.
    raise SystemExit("the database connection is lost")


if __name__ == "__main__":
    asyncio.run(main())
