"""The external-call ledger end to end: examples/python/external_call.py against a fake payment
API served here, which counts the charges it makes. Run by tests/run-in-cluster.sh with
examples/python/.venv's Python, against the cluster the libpq variables name.

1. A first delivery: one charge, confirmed, the payment written.
2. A second order's delivery; the API kills the consumer (SIGKILL) right after making the
   charge, before the consumer hears the response: the call is begun, never confirmed.
3. Its redelivery does not charge again, exits "in doubt", and the call is listed in
   idempotency.unconfirmed_calls, with the session that began it gone.
4. Someone resolves it with the charge the API made; the next redelivery writes the payment
   with that charge, still without calling.
5. Every delivery again: nothing charged, nothing written twice.
"""
import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DB = "idempotency_external_calls"


def fail(message):
    sys.exit(f"external_calls: {message}")


class Api(BaseHTTPRequestHandler):
    charges = []        # (order_id, charge_id) of every charge made
    kill_for = None     # order_id whose caller is killed once its charge is made
    consumer_pid = None

    def do_POST(self):
        order = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        charge_id = f"ch_{len(Api.charges) + 1}"
        Api.charges.append((order["order_id"], charge_id))
        if order["order_id"] == Api.kill_for:
            os.kill(Api.consumer_pid, signal.SIGKILL)  # the charge is made; its caller dies
            Api.kill_for = None
        body = json.dumps({"charge_id": charge_id}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def deliver(api_url, order, env):
    """One delivery to a fresh consumer process: its exit code (negative: killed by that signal)."""
    consumer = subprocess.Popen([sys.executable, os.path.join(ROOT, "examples/python/external_call.py"),
                                 api_url, json.dumps(order)], env=env, stderr=subprocess.PIPE, text=True)
    Api.consumer_pid = consumer.pid
    _, err = consumer.communicate(timeout=60)
    if consumer.returncode not in (0, 75, -signal.SIGKILL):
        fail(f"the consumer failed ({consumer.returncode}): {err}")
    return consumer.returncode


def main():
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB}")
        admin.execute(f"CREATE DATABASE {DB}")
    env = dict(os.environ, PGDATABASE=DB)
    db = psycopg.connect(dbname=DB, autocommit=True)
    db.execute("CREATE EXTENSION idempotency")
    db.execute("CREATE TABLE charges (id bigserial PRIMARY KEY, order_id int NOT NULL, charge_id text NOT NULL)")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api_url = f"http://127.0.0.1:{server.server_port}"
    first, second = {"order_id": 1, "amount": 10}, {"order_id": 2, "amount": 20}

    def charges_in_db():
        return db.execute("SELECT order_id, charge_id FROM charges ORDER BY order_id").fetchall()

    # 1. The usual path.
    if deliver(api_url, first, env) != 0 or Api.charges != [(1, "ch_1")] or charges_in_db() != [(1, "ch_1")]:
        fail(f"a first delivery should charge once and pay: {Api.charges}, {charges_in_db()}")

    # 2. Killed between the charge and its confirmation.
    Api.kill_for = 2
    code = deliver(api_url, second, env)
    if code != -signal.SIGKILL or Api.charges != [(1, "ch_1"), (2, "ch_2")] or charges_in_db() != [(1, "ch_1")]:
        fail(f"the consumer should die after charge ch_2 and before paying: exit {code}, {Api.charges}")
    state = db.execute("SELECT confirmed_at IS NULL FROM idempotency.external_calls WHERE key = 'order-2:paid'").fetchone()
    if state != (True,):
        fail(f"the charge should be begun and unconfirmed, not {state}")

    # 3. The redelivery: no second charge, in doubt, listed.
    code = deliver(api_url, second, env)
    if code != 75 or len(Api.charges) != 2 or charges_in_db() != [(1, "ch_1")]:
        fail(f"a redelivery of a call in doubt should park without charging: exit {code}, {Api.charges}")
    db.execute("SET idempotency.unconfirmed_after = 0")
    listed = db.execute("SELECT scope, key, step, consumer_connected FROM idempotency.unconfirmed_calls").fetchall()
    if listed != [("billing", "order-2:paid", "charge", False)]:
        fail(f"idempotency.unconfirmed_calls should list the call in doubt, its consumer gone, not {listed}")

    # 4. Resolved with what the API's records say; the next redelivery finishes the work.
    made = [c for o, c in Api.charges if o == 2]
    db.execute("SELECT idem_call_resolve('order-2:paid', 'billing', 'charge', happened => true, response => %s)",
               (json.dumps({"charge_id": made[0]}),))
    if deliver(api_url, second, env) != 0 or len(Api.charges) != 2 or charges_in_db() != [(1, "ch_1"), (2, "ch_2")]:
        fail(f"after resolving, the redelivery should pay with ch_2 without charging: {Api.charges}, {charges_in_db()}")
    if db.execute("SELECT count(*) FROM idempotency.unconfirmed_calls").fetchone() != (0,):
        fail("a resolved call should no longer be listed")

    # 5. Every message again.
    for order in (first, second):
        if deliver(api_url, order, env) != 0:
            fail("a delivery of a finished message should be acked")
    if len(Api.charges) != 2 or charges_in_db() != [(1, "ch_1"), (2, "ch_2")]:
        fail(f"redeliveries of finished messages should change nothing: {Api.charges}, {charges_in_db()}")

    server.shutdown()
    db.close()
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {DB}")
    print("external_calls: 2 orders, 7 deliveries, one killed after its charge: 2 charges made, "
          "2 payments written; the call in doubt was parked, listed, resolved, and never repeated")


if __name__ == "__main__":
    main()
