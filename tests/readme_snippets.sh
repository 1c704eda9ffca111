#!/usr/bin/env bash
# The README's "Using it from your language" snippets, run for real. First tests/readme_sync.sh:
# every snippet is, word for word, the marked excerpt of a file under examples/. Then, for the
# Python and the Node.js consumers (examples/python, examples/node): KEYS payments, each published
# twice, go to a fresh RabbitMQ queue; the consumer is started, SIGKILLed in the middle of a
# payment's transaction three times and started again, so that the broker redelivers what was
# unacked; at the end there must be exactly one payment per key, none lost (count and sum).
# PostgreSQL: the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD) of the caller's cluster,
# where the extension is installed; databases snippets_readme_<lang> are made and dropped.
# RabbitMQ: AMQP_URL (default amqp://guest:guest@127.0.0.1:5672). Dependencies are installed on
# first use, pinned: examples/python/.venv (requirements.txt), examples/node/node_modules (npm ci).
# examples/python/outbox.py, the README's outbox sequence, runs the same way (python_outbox) and its
# outbox must hold exactly one announcement per payment, under the id the claim derives.
# The Go consumer (examples/go, with ANNOUNCE=1 the outbox sequence) is built offline from Debian's
# packages (golang-go 1.19, pgx v4, amqp091-go) in GOPATH mode, and runs the same way.
# The Java consumer (examples/java) is compiled with javac against Debian's JDBC driver and RabbitMQ
# client (libpostgresql-jdbc-java, librabbitmq-client-java) and reaches the server over TCP to localhost.
# examples/python/pipeline.py (python_pipeline) is the README's one-round-trip form, run the same way.
# LANGS: which consumers to run (default "python python_outbox python_pipeline node rust go go_outbox java"); NODE_CONSUMER,
# PYTHON_CONSUMER, PYTHON_OUTBOX_CONSUMER: another consumer file to run in place of the example's.
set -euo pipefail
cd "$(dirname "$0")/.."
export AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672}
KEYS=${KEYS:-30}
SEED=${SEED:-$RANDOM}
fail() { echo "readme_snippets: $*" >&2; exit 1; }

bash tests/readme_sync.sh

# --- pinned dependencies, installed when missing or out of date -------------------------
source tests/examples.sh
examples_python
examples_node
broker() { "$venv/bin/python" tests/readme_snippets/broker.py "$@"; }
"$venv/bin/python" -c 'import os, pika; pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"])).close()' \
  2>/dev/null || fail "no RabbitMQ at $AMQP_URL (set AMQP_URL)"

sql() { psql -qXAt -v ON_ERROR_STOP=1 "$@"; }

# run_lang NAME COMMAND...: one full run against a fresh database and a fresh queue.
run_lang() {
  local lang=$1; shift
  local db=snippets_readme_$lang queue=readme_snippets_${lang}_$$ log=target/readme_snippets_$lang.log
  mkdir -p target; : >"$log"
  sql -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
  # Each insert sleeps 0.2 s, so that a kill can be timed to land inside a payment's transaction.
  sql -d postgres -c "ALTER DATABASE $db SET payments.insert_delay = 0.2"
  PGDATABASE=$db sql -f tests/readme_snippets/payments.sql
  local expected_sum
  expected_sum=$(broker publish "$queue" "$KEYS" "$SEED")
  echo "== $lang: $((2 * KEYS)) messages ($KEYS keys, each twice, seed $SEED) on queue $queue"

  local pid
  start() { QUEUE=$queue PGDATABASE=$db "$@" >>"$log" 2>&1 & pid=$!; }
  q() { PGDATABASE=$db sql -c "$1"; }
  inflight="SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
              AND pid <> pg_backend_pid() AND state = 'active' AND query ILIKE 'insert%payments%'"

  # Three SIGKILLs, each once at least $threshold payments are in and one is being inserted.
  # (Waiting gives up after a minute and kills anyway: a consumer that commits nothing fails below.)
  local threshold rows where
  for threshold in $((KEYS / 6)) $((KEYS / 2)) $((KEYS * 5 / 6)); do
    start "$@"
    where="after waiting a minute for $threshold"
    for _ in $(seq 1 1200); do
      kill -0 "$pid" 2>/dev/null || { tail -20 "$log"; fail "$lang: the consumer exited by itself"; }
      rows=$(q "SELECT count(*) FROM payments")
      [[ $rows -ge $threshold && $(q "$inflight") -gt 0 ]] && { where="while one was being inserted"; break; }
      sleep 0.05
    done
    kill -KILL "$pid"; wait "$pid" 2>/dev/null || true
    echo "   SIGKILL with $rows payments committed, $where; restarting"
  done

  # Then run until the queue is empty: stop the consumer once nothing is ready and the payments
  # are quiet, and look again after the broker has requeued what the consumer had left unacked.
  local round status ready consumers last
  for round in $(seq 1 10); do
    start "$@"
    for _ in $(seq 1 1200); do
      kill -0 "$pid" 2>/dev/null || { tail -20 "$log"; fail "$lang: the consumer exited by itself"; }
      read -r ready consumers <<<"$(broker status "$queue")"
      [[ $ready == 0 ]] && break
      sleep 0.1
    done
    last=-1
    for _ in $(seq 1 120); do
      rows=$(q "SELECT count(*) FROM payments")
      [[ $rows == "$last" && $(q "$inflight") == 0 ]] && break
      last=$rows; sleep 1
    done
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      read -r ready consumers <<<"$(broker status "$queue")"
      [[ $consumers == 0 ]] && break
      sleep 0.1
    done
    [[ $ready == 0 ]] && break
    echo "   $ready messages still queued after round $round; running the consumer again"
  done
  [[ $ready == 0 ]] || fail "$lang: $ready messages never consumed"
  broker delete "$queue"

  local got
  got=$(q "SELECT count(*) || ' ' || count(DISTINCT order_id) || ' ' || coalesce(sum(amount), 0) FROM payments")
  local dup
  dup=$(q "SELECT coalesce(string_agg(order_id || ' x' || n, ', '), '') FROM
           (SELECT order_id, count(*) AS n FROM payments GROUP BY 1 HAVING count(*) > 1) d")
  # An outbox consumer announces each payment once: one message per payment, under the id its
  # claim derives (the broker's key is order_id || ':paid'), with the payment's order and amount.
  local announced=''
  if [[ $lang == *_outbox ]]; then
    announced=$(q "SELECT count(*) || ' ' || count(p.order_id) FROM idempotency.outbox o
                   LEFT JOIN payments p ON o.id = idem_message_id(p.order_id || ':paid', 'billing', 1)
                    AND o.topic = 'payments.paid' AND o.ordering_key = p.order_id
                    AND o.payload ->> 'order_id' = p.order_id AND (o.payload ->> 'amount')::numeric = p.amount")
  fi
  sql -d postgres -c "DROP DATABASE $db"
  [[ -z $dup ]] || fail "$lang: paid more than once: $dup"
  [[ $got == "$KEYS $KEYS $expected_sum" ]] ||
    fail "$lang: expected $KEYS payments summing to $expected_sum, got (rows, orders, sum) = $got"
  echo "   $lang: $KEYS payments, one per key, summing to $expected_sum: none lost, none twice"
  if [[ $lang == *_outbox ]]; then
    [[ $announced == "$KEYS $KEYS" ]] ||
      fail "$lang: expected $KEYS announcements, one per payment; got (messages, matching a payment) = $announced"
    echo "   $lang: $KEYS announcements in the outbox, one per payment, each under its claim's message id"
  fi
}

wanted() { [[ " ${LANGS:-python python_outbox python_pipeline node rust go go_outbox java} " == *" $1 "* ]]; }
if wanted python; then
  run_lang python "$venv/bin/python" "${PYTHON_CONSUMER:-examples/python/consumer.py}"
fi
if wanted python_outbox; then
  run_lang python_outbox "$venv/bin/python" "${PYTHON_OUTBOX_CONSUMER:-examples/python/outbox.py}"
fi
if wanted python_pipeline; then
  run_lang python_pipeline "$venv/bin/python" examples/python/pipeline.py
fi
if wanted node; then
  run_lang node node "${NODE_CONSUMER:-examples/node/consumer.js}"
fi
# The Rust consumer too, where cargo is (it is wherever the extension is built); the first build of
# its dependencies takes about a minute.
if ! wanted rust; then
  :
elif command -v cargo >/dev/null; then
  examples_rust
  run_lang rust sh -c "$RUST_CONSUMER"
else
  echo "== rust: no cargo here; examples/rust is only compared with the README (tests/readme_sync.sh)"
fi
if wanted go || wanted go_outbox; then
  examples_go || fail "cannot build the Go consumer"
  if wanted go; then run_lang go sh -c "$GO_CONSUMER"; fi
  if wanted go_outbox; then run_lang go_outbox env ANNOUNCE=1 sh -c "$GO_CONSUMER"; fi
fi
if wanted java; then
  examples_java || fail "cannot build the Java consumer"
  run_lang java sh -c "$JAVA_CONSUMER"
fi
