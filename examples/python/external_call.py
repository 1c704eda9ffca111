"""A consumer step that charges an external payment API which takes no idempotency key, so that
a redelivery never charges twice (README, "External calls").

The call ledger records "begun" before the call and the response after it, each committed on
its own; the payment is then written in the consumer's transaction with its claim. A crash
between the call and its confirmation leaves the call in doubt: a redelivery does not call
again, and the call waits in idempotency.unconfirmed_calls until someone resolves it.

Run as `external_call.py API_URL ORDER_JSON` it handles one delivery of ORDER_JSON
({"order_id": ..., "amount": ...}) and exits 0 when the delivery is done (ack it), 75 when the
call is in doubt (park it). PostgreSQL comes from the libpq variables. tests/external_calls.py
runs it against a fake API that counts calls and kills it in the middle; the part between the
README markers is the README's Python sequence, word for word.
"""
import json
import sys
import urllib.request

import psycopg
from psycopg.types.json import Jsonb


class InDoubt(Exception):
    """The call was begun and never confirmed: it may have happened. Do not guess."""


def charge_api(api_url, order):
    request = urllib.request.Request(f"{api_url}/charges", data=json.dumps(order).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


# README:begin external python
conn = psycopg.connect(autocommit=True)  # each statement outside conn.transaction() commits at once


def handle(api_url, order):
    key = f"order-{order['order_id']}:paid"
    # 1. "begun", committed before the call is made.
    state, response = conn.execute(
        "SELECT state, response FROM idem_call_begin(%s, 'billing', 'charge')", (key,)).fetchone()
    if state == "in_doubt":  # begun before, never confirmed: the charge may have happened
        raise InDoubt(key)   # park the message; idempotency.unconfirmed_calls lists the call
    if state == "new":
        response = charge_api(api_url, order)
        # 2. the response, committed: every redelivery reuses it instead of calling again.
        conn.execute("SELECT idem_call_confirm(%s, 'billing', 'charge', %s)", (key, Jsonb(response)))
    # 3. the effect, with the claim, in the consumer's own transaction; ack after it commits.
    with conn.transaction():
        if conn.execute("SELECT idem_claim(%s, 'billing')", (key,)).fetchone()[0]:
            conn.execute("INSERT INTO charges (order_id, charge_id) VALUES (%s, %s)",
                         (order["order_id"], response["charge_id"]))
# README:end external python


if __name__ == "__main__":
    try:
        handle(sys.argv[1], json.loads(sys.argv[2]))
    except InDoubt as e:
        print(f"in doubt: {e}; parked", file=sys.stderr)
        sys.exit(75)
