"""consumer.py's consumer in one round trip per message: the claim inside the business INSERT
(README, "One round trip per message"), and BEGIN, that INSERT and COMMIT sent as one pipeline
(psycopg's conn.transaction() would sync after each of them). A duplicate's INSERT inserts nothing. tests/readme_snippets.sh runs it like consumer.py; the part between the
README markers is the README's pipelined Python, word for word.
"""
import json

from psycopg.pq import TransactionStatus

from consumer import conn, log, main


# README:begin pipeline python
def on_message(channel, method, properties, body):
    key = properties.message_id
    payment = json.loads(body)
    try:
        with conn.pipeline():  # BEGIN, the INSERT and COMMIT go out together; one sync at the end
            conn.execute("BEGIN")
            conn.execute("INSERT INTO payments (order_id, amount) SELECT %s, %s WHERE idem_claim(%s, 'billing')",
                         (payment["order_id"], payment["amount"], key))
            conn.execute("COMMIT")
    except Exception:
        log.exception("payment %s rolled back; the broker delivers it again", key)
        if not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
            conn.execute("ROLLBACK")  # a failed statement skipped the COMMIT and left BEGIN open
        channel.basic_nack(method.delivery_tag, requeue=True)
        if conn.broken:  # the server is gone (a restart, a failover): exit, a supervisor restarts us
            raise
        return
    channel.basic_ack(method.delivery_tag)  # only after COMMIT: a duplicate is acked too
# README:end pipeline python


if __name__ == "__main__":
    main(on_message)
