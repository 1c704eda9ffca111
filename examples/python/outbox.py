"""consumer.py's consumer, announcing each new payment downstream through the outbox (README,
"Outbox"): the claim, the payment and the announcement commit together, and idempotency-relay
publishes the announcement after commit. tests/readme_snippets.sh runs it like consumer.py and
checks the outbox too; the part between the README markers is the README's Python outbox
sequence, word for word.
"""
import json

from psycopg.types.json import Jsonb

from consumer import conn, log, main


# README:begin outbox python
def on_message(channel, method, properties, body):
    key = properties.message_id
    payment = json.loads(body)
    try:
        with conn.transaction():  # conn is in autocommit mode: this is BEGIN ... COMMIT
            new = conn.execute("SELECT idem_claim(%s, 'billing')", (key,)).fetchone()[0]
            if new:
                conn.execute("INSERT INTO payments (order_id, amount) VALUES (%s, %s)",
                             (payment["order_id"], payment["amount"]))
                # Its id is idem_message_id(key, 'billing', 1): the same on every run of this
                # handler for this key. Built from the message alone, never from now(), so
                # that a run again sends the same message and not a different one (ID001).
                conn.execute("SELECT idem_send('payments.paid', %s, ordering_key => %s)",
                             (Jsonb({"order_id": payment["order_id"], "amount": payment["amount"]}),
                              payment["order_id"]))
    except Exception:
        log.exception("payment %s rolled back; the broker delivers it again", key)
        channel.basic_nack(method.delivery_tag, requeue=True)
        if conn.broken:  # the server is gone (a restart, a failover): exit, a supervisor restarts us
            raise
        return
    channel.basic_ack(method.delivery_tag)  # only after COMMIT: the payment and its announcement
# README:end outbox python


if __name__ == "__main__":
    main(on_message)
