"""A RabbitMQ consumer of payment messages that pays each order once, however often it is delivered.

Each message is {"order_id": ..., "amount": ...} with its idempotency key as the AMQP message_id.
PostgreSQL comes from the libpq variables (PGHOST, PGPORT, PGUSER, PGDATABASE, ...), the broker from
AMQP_URL, the queue from QUEUE. tests/readme_snippets.sh runs it, kills it and runs it again; the
part between the README markers is the Python snippet of README.md, word for word.
"""
import json
import logging
import os

import pika
import psycopg

log = logging.getLogger("consumer")

# README:begin python
# autocommit=True, so that conn.transaction() is a real BEGIN ... COMMIT: without it, any earlier
# statement leaves a transaction open, conn.transaction() is only a savepoint, and the ack would
# come before any COMMIT. (One connection is enough: pika calls on_message one at a time.)
conn = psycopg.connect(autocommit=True)


def on_message(channel, method, properties, body):
    key = properties.message_id
    payment = json.loads(body)
    try:
        with conn.transaction():  # BEGIN; COMMIT at the end of the block, ROLLBACK on an exception
            new = conn.execute("SELECT idem_claim(%s, 'billing')", (key,)).fetchone()[0]
            if new:
                conn.execute("INSERT INTO payments (order_id, amount) VALUES (%s, %s)",
                             (payment["order_id"], payment["amount"]))
    except Exception:
        log.exception("payment %s rolled back; the broker delivers it again", key)
        channel.basic_nack(method.delivery_tag, requeue=True)
        if conn.broken:  # the server is gone (a restart, a failover): exit, a supervisor restarts us
            raise
        return
    channel.basic_ack(method.delivery_tag)  # only after COMMIT: a duplicate is acked too
# README:end python


def main(handler=on_message):
    logging.basicConfig(level=logging.INFO)
    url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
    queue = os.environ.get("QUEUE", "payments")
    broker = pika.BlockingConnection(pika.URLParameters(url))
    channel = broker.channel()
    channel.queue_declare(queue, durable=True)
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume(queue, handler)
    channel.start_consuming()


if __name__ == "__main__":
    main()
