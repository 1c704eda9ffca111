"""make e2e: every source of duplicates, injected for real against the machine's brokers, with the
examples/ consumers in every language; then the business state is checked.

Each source gets a database of its own (the consumers' payments table, a trigger that makes each
insert take a while so that a kill can land mid-stream, and idempotency.diagnostics on, so that
every duplicate a claim suppresses is counted in idempotency.duplicates) and queues or streams
named after this run, removed at the end. Every key must end with exactly one payment of its
amount: none lost, none doubled. Prints one row per source and consumer.

Run by tests/e2e.sh, which builds the consumers and passes their commands as E2E_CMD_<name>
(shell commands; each reads PGDATABASE, QUEUE, STREAM, DURABLE from its environment).
"""
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

import nats
import pika
import psycopg
from nats.js.api import ConsumerConfig, StreamConfig

AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
RUN = f"{os.getpid()}"
KEYS = int(os.environ.get("E2E_KEYS", "40"))
LOGS = os.environ.get("E2E_LOGS", "target/e2e")
rows = []
started = []  # every consumer process, killed at exit whatever happened
queues = set()  # every queue made, deleted at exit


def fail(message):
    print(f"e2e: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def sql(db, statement, *args):
    with psycopg.connect(dbname=db, autocommit=True) as conn:
        cur = conn.execute(statement, args or None)
        return cur.fetchall() if cur.description else None


def fresh_database(name, insert_delay):
    db = f"e2e_{name}"
    sql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    sql("postgres", f"CREATE DATABASE {db}")
    sql("postgres", f"ALTER DATABASE {db} SET idempotency.diagnostics = on")
    sql("postgres", f"ALTER DATABASE {db} SET payments.insert_delay = {insert_delay}")
    with open("tests/readme_snippets/payments.sql") as f:
        subprocess.run(["psql", "-qXAt", "-v", "ON_ERROR_STOP=1", "-d", db], stdin=f, check=True,
                       stdout=subprocess.DEVNULL)
    return db


def payments(source, n=KEYS):
    """n messages: (message id, order id, amount as text with two decimals)."""
    rng = random.Random(source)
    return [(f"{source}-{i}", f"order-{source}-{i}", f"{rng.randint(100, 99999) / 100:.2f}") for i in range(n)]


class Consumer:
    """One consumer process of language `lang`, its output in LOGS/<name>.log."""

    def __init__(self, lang, name, **env):
        os.makedirs(LOGS, exist_ok=True)
        self.log = open(f"{LOGS}/{name}.log", "a")
        command = os.environ[f"E2E_CMD_{lang}"]
        self.proc = subprocess.Popen(["sh", "-c", command], env={**os.environ, **env},
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(self)

    def alive(self):
        return self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            os.killpg(self.proc.pid, sig)
        self.proc.wait()

    def stop(self):
        self.kill(signal.SIGTERM)


# --- RabbitMQ --------------------------------------------------------------------------------
def amqp():
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    return connection, connection.channel()


def publish(queue, messages, message_id=lambda m: m[0]):
    connection, channel = amqp()
    channel.confirm_delivery()
    for m in messages:
        body = json.dumps({"order_id": m[1], "amount": float(m[2])})
        channel.basic_publish("", queue, body, pika.BasicProperties(message_id=message_id(m), delivery_mode=2))
    connection.close()


def queue_state(queue):
    """(ready messages, consumers)."""
    connection, channel = amqp()
    q = channel.queue_declare(queue, passive=True)
    connection.close()
    return q.method.message_count, q.method.consumer_count


def declare(queue):
    connection, channel = amqp()
    channel.queue_declare(queue, durable=True)
    connection.close()
    queues.add(queue)


def delete(*names):
    connection, channel = amqp()
    for q in names:
        channel.queue_delete(q)
        queues.discard(q)
    connection.close()


def quiet(db, seconds=1.5):
    """Waits until no payment is being inserted and the count stood still for `seconds`."""
    last, since = None, time.time()
    deadline = time.time() + 120
    while time.time() < deadline:
        count, active = sql(db, """SELECT (SELECT count(*) FROM payments),
            (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
              AND pid <> pg_backend_pid() AND state <> 'idle')""")[0]
        if count != last or active:
            last, since = count, time.time()
        elif time.time() - since >= seconds:
            return
        time.sleep(0.2)
    fail(f"{db}: payments never came to rest")


def drain_rabbit(lang, name, db, queue, instances=1, running=(), **env):
    """Runs consumers (first those `running`, if any) until the queue is empty, nothing is
    unacked, and the payments are quiet."""
    for attempt in range(10):
        consumers = list(running) if running and attempt == 0 else [
            Consumer(lang, name, PGDATABASE=db, QUEUE=queue, **env) for _ in range(instances)]
        deadline = time.time() + 180
        while queue_state(queue)[0] and time.time() < deadline:
            if not all(c.alive() for c in consumers):
                fail(f"{name}: a consumer exited by itself (see {LOGS}/{name}.log)")
            time.sleep(0.2)
        quiet(db)
        for c in consumers:
            c.stop()
        for _ in range(100):  # what the stopped consumers left unacked is ready again
            if queue_state(queue)[1] == 0:
                break
            time.sleep(0.1)
        if queue_state(queue)[0] == 0:
            return
    fail(f"{name}: the queue never emptied")


# --- checks -----------------------------------------------------------------------------------
def check(source, lang, db, expected, sent, detail=""):
    """expected: [(message id, order id, amount)] that must each be paid exactly once."""
    paid = {}
    for order_id, amount, n in sql(db, "SELECT order_id, sum(amount)::text, count(*) FROM payments GROUP BY 1"):
        paid[order_id] = (amount, n)
    lost = [o for _, o, _ in expected if o not in paid]
    doubled = [o for o, (_, n) in paid.items() if n > 1]
    wrong = [o for _, o, a in expected if o in paid and paid[o][1] == 1 and paid[o][0] != a]
    stray = [o for o in paid if o not in {e[1] for e in expected}]
    effects = sum(n for _, n in paid.values())
    suppressed = sql(db, "SELECT count(*) FROM idempotency.duplicates")[0][0]
    rows.append((source, lang, sent, effects + suppressed, suppressed, effects, len(lost), len(doubled), detail))
    sql("postgres", f"DROP DATABASE {db} WITH (FORCE)")
    if lost or doubled or wrong or stray:
        fail(f"{source} ({lang}): lost {lost[:5]}, doubled {doubled[:5]}, wrong amount {wrong[:5]}, unexpected {stray[:5]}")
    return suppressed


# --- the sources ------------------------------------------------------------------------------
def producer_twice(lang):
    """The producer publishes every message twice (a retry after a lost publisher confirm)."""
    db, queue, msgs = fresh_database(f"twice_{lang}", 0.02), f"e2e_twice_{lang}_{RUN}", payments("twice")
    declare(queue)
    publish(queue, [m for m in msgs for _ in (1, 2)])
    drain_rabbit(lang, f"twice_{lang}", db, queue)
    delete(queue)
    suppressed = check("producer publishes twice", lang, db, msgs, 2 * KEYS)
    if suppressed != KEYS:
        fail(f"producer twice ({lang}): {suppressed} duplicates suppressed, want {KEYS}")


def kill_after_commit(lang, kills=3, at_ack=5):
    """The consumer is SIGKILLed after COMMIT, before the ack (E2E_KILL_AT_ACK): the broker
    redelivers a message whose effect is already committed."""
    name = f"kill_{lang}"
    db, queue, msgs = fresh_database(name, 0.02), f"e2e_kill_{lang}_{RUN}", payments("kill")
    declare(queue)
    publish(queue, msgs)
    for k in range(kills):
        c = Consumer(lang, name, PGDATABASE=db, QUEUE=queue, E2E_KILL_AT_ACK=str(at_ack))
        if c.proc.wait(timeout=120) != -signal.SIGKILL and c.proc.returncode != 128 + signal.SIGKILL:
            fail(f"{name}: run {k + 1} ended with {c.proc.returncode}, not by its SIGKILL before ack {at_ack}")
    drain_rabbit(lang, name, db, queue)
    delete(queue)
    suppressed = check("SIGKILL after COMMIT, before ack", lang, db, msgs, KEYS, f"{kills} kills")
    if suppressed != kills:
        fail(f"{name}: {suppressed} duplicates suppressed, want one per kill ({kills})")


def dlq_replay(lang):
    """Messages wait too long in the queue (a 2 s TTL, set by an operator's policy), are
    dead-lettered, and the operator replays the whole dead-letter queue, though some of them had
    a twin that was already applied."""
    name = f"dlq_{lang}"
    db, msgs = fresh_database(name, 0.2), payments("dlq")
    queue, dlq, replay = f"e2e_dlq_main_{lang}_{RUN}", f"e2e_dlq_dead_{lang}_{RUN}", f"e2e_dlq_replay_{lang}_{RUN}"
    policy = f"e2e-dlq-{RUN}"
    subprocess.run(["rabbitmqctl", "-q", "set_policy", policy, f"^{queue}$",
                    json.dumps({"message-ttl": 2000, "dead-letter-exchange": "", "dead-letter-routing-key": dlq}),
                    "--apply-to", "queues"], check=True, stdout=subprocess.DEVNULL)
    try:
        for q in (queue, dlq, replay):
            declare(q)
        # Every message once, then every message again (a producer's resend): the later copies
        # wait longest, so the dead letters include copies whose twin was already applied.
        publish(queue, msgs + msgs)
        drain_rabbit(lang, name, db, queue)
        dead = queue_state(dlq)[0]
        # The replay: every dead letter back, as a shovel or an operator's script sends them.
        paid = {o for (o,) in sql(db, "SELECT order_id FROM payments")}
        connection, channel = amqp()
        channel.confirm_delivery()
        applied = 0
        while True:
            method, properties, body = channel.basic_get(dlq)
            if method is None:
                break
            applied += json.loads(body)["order_id"] in paid
            channel.basic_publish("", replay, body, pika.BasicProperties(message_id=properties.message_id, delivery_mode=2))
            channel.basic_ack(method.delivery_tag)
        connection.close()
        if dead == 0 or applied == 0 or applied == dead:
            fail(f"{name}: {dead} dead letters, {applied} of them already applied: the source did not happen")
        drain_rabbit(lang, name, db, replay)
    finally:
        subprocess.run(["rabbitmqctl", "-q", "clear_policy", policy], stdout=subprocess.DEVNULL)
        delete(queue, dlq, replay)
    check("DLQ replay", lang, db, msgs, 2 * KEYS + dead, f"{dead} dead-lettered and replayed, {applied} already applied")


def three_consumers(lang):
    """Three consumers share a queue; one is SIGKILLed mid-stream, with messages still queued, so
    that it holds a full prefetch (10) unacked."""
    name = f"three_{lang}"
    db, queue, msgs = fresh_database(name, 0.1), f"e2e_three_{lang}_{RUN}", payments("three", 3 * KEYS)
    declare(queue)
    publish(queue, msgs)
    consumers = [Consumer(lang, name, PGDATABASE=db, QUEUE=queue) for _ in range(3)]
    deadline = time.time() + 60
    while sql(db, "SELECT count(*) FROM payments")[0][0] < KEYS // 2 and time.time() < deadline:
        time.sleep(0.05)
    paid, queued = sql(db, "SELECT count(*) FROM payments")[0][0], queue_state(queue)[0]
    if queued == 0:
        fail(f"{name}: the queue was empty at the kill, so the killed consumer held nothing unacked")
    if not consumers[0].alive():
        fail(f"{name}: the consumer to kill had already exited (see {LOGS}/{name}.log)")
    consumers[0].kill()
    if consumers[0].proc.returncode != -signal.SIGKILL:
        fail(f"{name}: the killed consumer ended with {consumers[0].proc.returncode}, not by SIGKILL")
    drain_rabbit(lang, name, db, queue, instances=2, running=consumers[1:])
    delete(queue)
    check("3 consumers, one SIGKILLed mid-stream", lang, db, msgs, len(msgs),
          f"killed after {paid} payments, {queued} still queued")


# --- NATS JetStream ---------------------------------------------------------------------------
def on_stream(tag, ack_wait, lang, name, db, *publications):
    """A fresh stream with a durable push consumer ("payments") of the given AckWait; for each
    (messages, message id) publication, publishes them and runs the consumer until every message
    is acked and the payments are quiet. The stream is deleted at the end."""
    stream, subject = f"E2E_{tag.upper()}_{RUN}", f"e2e.{RUN}.{tag}"

    async def run():
        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        try:
            await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
            await js.add_consumer(stream, ConsumerConfig(durable_name="payments", deliver_subject=f"{subject}.deliver",
                                                         ack_wait=ack_wait, max_deliver=-1))
            for messages, message_id in publications:
                for m in messages:
                    body = json.dumps({"order_id": m[1], "amount": float(m[2])}).encode()
                    await js.publish(subject, body, headers={"Nats-Msg-Id": message_id(m)})
                await drain(js)
        finally:
            await js.delete_stream(stream)
            await nc.close()

    async def drain(js):
        c = Consumer(lang, name, PGDATABASE=db, STREAM=stream, DURABLE="payments", NATS_URL=NATS_URL)
        deadline = time.time() + 180
        while time.time() < deadline:
            if not c.alive():
                fail(f"{name}: the consumer exited by itself (see {LOGS}/{name}.log)")
            info = await js.consumer_info(stream, "payments")
            if info.num_pending == 0 and info.num_ack_pending == 0:
                break
            await asyncio.sleep(0.2)
        else:
            fail(f"{name}: JetStream never drained")
        quiet(db)
        c.stop()

    asyncio.run(run())


def ack_deadline(lang):
    """Processing outlives JetStream's AckWait (1 s): the server pushes every message at once, the
    consumer handles them one at a time (0.3 s each), and whatever waited longer than the AckWait
    is delivered again while it waits or is being handled."""
    name = f"ackwait_{lang}"
    db, msgs = fresh_database(name, 0.3), payments("ackwait")[:20]
    on_stream("ackwait", 1.0, lang, name, db, (msgs, lambda m: m[0]))
    suppressed = check("processing outlives AckWait (1 s)", lang, db, msgs, len(msgs), "0.3 s per payment")
    if suppressed == 0:
        fail(f"{name}: nothing was redelivered; the source did not happen")


def backfill(lang):
    """A backfill publishes every order again under new message ids: only the business key
    (idem_key('payment', order_id), which the NATS consumer claims) recognises them."""
    name = f"backfill_{lang}"
    db, msgs = fresh_database(name, 0.01), payments("backfill")
    on_stream("backfill", 30.0, lang, name, db, (msgs, lambda m: m[0]), (msgs, lambda m: "backfill-" + m[0]))
    suppressed = check("backfill, new message ids", lang, db, msgs, 2 * KEYS, "")
    if suppressed != KEYS:
        fail(f"{name}: {suppressed} duplicates suppressed, want {KEYS}")


SOURCES = {
    "twice": producer_twice,
    "kill": kill_after_commit,
    "ackwait": ack_deadline,
    "dlq": dlq_replay,
    "backfill": backfill,
    "three": three_consumers,
}


def main():
    plan = [p.split(":") for p in os.environ.get(
        "E2E_PLAN", "twice:node kill:go kill:java ackwait:python_nats dlq:python dlq:rust backfill:python_nats three:rust three:java").split()]
    try:
        for source, lang in plan:
            began = time.time()
            SOURCES[source](lang)
            print(f"e2e: {source} with {lang}: passed in {time.time() - began:.0f} s", flush=True)
    finally:
        for c in started:
            c.kill()
        if queues:
            delete(*queues)
    header = ("source", "consumer", "sent", "deliveries committed", "duplicates suppressed", "effects", "lost", "doubled", "note")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print()
    print("| " + " | ".join(str(h).ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |")
    print(f"\ne2e: {len(rows)} runs, every effect applied exactly once, none lost")


if __name__ == "__main__":
    main()
