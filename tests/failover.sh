#!/usr/bin/env bash
# Failover (#14): a primary with a streaming standby made by pg_basebackup, and the README's
# Python consumer (examples/python/consumer.py) draining a RabbitMQ queue of FAILOVER_KEYS
# payments, each published twice. Once a third of them are paid, the primary is stopped with
# `pg_ctl stop -m immediate` and the standby promoted; the consumer, which reaches the servers
# through libpq's host list with target_session_attrs=read-write, dies with its connection and
# is started again by a loop, and the broker redelivers what it had not acked. Run once with
# synchronous replication and once with asynchronous. Then on the promoted standby:
#   - sync: every payment exactly once, none lost, none doubled, the sum as published;
#   - async: none doubled; the payments lost (committed on the primary, acked, never on the
#     standby) are counted and reported, since nothing redelivers an acked message. Before the
#     stop the standby's WAL receiver is paused for a second, so that there is a lag to lose.
# Prints one line per mode: deliveries, payments, lost, doubled. Both servers' logs go through
# tests/leak_sentinel.sh.
#   PG_BINDIR        the server's binaries (default the system's 15), with the extension
#   FAILOVER_KEYS    payments (default 1000)
#   FAILOVER_MODES   default "sync async"
#   AMQP_URL         default amqp://guest:guest@127.0.0.1:5672; the queue is this run's own
# Run as root; PostgreSQL runs as postgres.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PG_BINDIR=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
KEYS=${FAILOVER_KEYS:-1000}
MAJOR=$("$PG_BINDIR/postgres" -V | sed -E 's/^postgres \(PostgreSQL\) ([0-9]+).*/\1/')
MODES=${FAILOVER_MODES:-sync async}
export AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672}
fail() { echo "failover: $*" >&2; exit 1; }

source tests/python-venv.sh
broker() { "$venv/bin/python" tests/readme_snippets/broker.py "$@"; }

RUN=$(mktemp -d /tmp/idempotency-failover.XXXXXX)
chown postgres: "$RUN"
as_postgres() { runuser -u postgres -- "$@"; }
queue=failover_$$
supervisor=''
cleanup() {
  [ -z "$supervisor" ] || kill "$supervisor" 2>/dev/null || true
  pkill -f "failover-consumer-$$" 2>/dev/null || true
  for data in "$RUN"/*/primary "$RUN"/*/standby; do
    [ -d "$data" ] && as_postgres "$PG_BINDIR/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 || true
  done
  broker delete "$queue" 2>/dev/null || true
  rm -rf "$RUN"
}
trap cleanup EXIT

sql() { psql -qXAt -v ON_ERROR_STOP=1 -h "$RUN" -U postgres "$@"; }

for mode in $MODES; do
  dir=$RUN/$mode primary=$RUN/$mode/primary standby=$RUN/$mode/standby
  mkdir -p "$dir" && chown postgres: "$dir"
  as_postgres "$PG_BINDIR/initdb" -D "$primary" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 \
    --no-sync >/dev/null
  cat >>"$primary/postgresql.conf" <<EOF
port = 5621
listen_addresses = ''
unix_socket_directories = '$RUN'
wal_level = replica
max_wal_senders = 4
synchronous_commit = on
EOF
  as_postgres "$PG_BINDIR/pg_ctl" -D "$primary" -l "$dir/primary.log" -w start >/dev/null
  sql -p 5621 -d postgres -c "CREATE DATABASE failover"
  sql -p 5621 -d failover -f tests/readme_snippets/payments.sql
  as_postgres "$PG_BINDIR/pg_basebackup" -D "$standby" -R -X stream -c fast \
    -d "host=$RUN port=5621 user=postgres application_name=standby"
  echo "port = 5622" >>"$standby/postgresql.auto.conf"
  as_postgres "$PG_BINDIR/pg_ctl" -D "$standby" -l "$dir/standby.log" -w start >/dev/null
  # Synchronous only once the standby streams: before, every commit would wait for it.
  want=streaming/async
  if [ "$mode" = sync ]; then
    sql -p 5621 -d postgres -c "ALTER SYSTEM SET synchronous_standby_names = 'standby'" -c "SELECT pg_reload_conf()" >/dev/null
    want=streaming/sync
  fi
  for _ in $(seq 1 100); do
    [ "$(sql -p 5621 -d postgres -c "SELECT state || '/' || sync_state FROM pg_stat_replication")" = "$want" ] && break
    sleep 0.1
  done
  [ "$(sql -p 5621 -d postgres -c "SELECT state || '/' || sync_state FROM pg_stat_replication")" = "$want" ] ||
    fail "$mode: the standby is not $want"

  expected_sum=$(broker publish "$queue" "$KEYS" "$RANDOM")
  # The consumer as a user would run it under a supervisor: started again whenever it dies.
  (
    export PGHOST=$RUN,$RUN PGPORT=5621,5622 PGUSER=postgres PGDATABASE=failover \
      PGTARGETSESSIONATTRS=read-write PGCONNECT_TIMEOUT=2 QUEUE=$queue
    while :; do
      "$venv/bin/python" examples/python/consumer.py "failover-consumer-$$" >>"$dir/consumer.log" 2>&1 || true
      sleep 0.2
    done
  ) &
  supervisor=$!

  paid() { sql -p "$1" -d failover -c "SELECT count(*) FROM payments" 2>/dev/null || echo 0; }
  for _ in $(seq 1 600); do
    [ "$(paid 5621)" -ge $((KEYS / 3)) ] && break
    sleep 0.1
  done
  # The standby falls behind for a second first (its WAL receiver stopped), as one does under
  # load or across a slow link: with asynchronous replication the primary commits, and the
  # consumer acks, what the standby never receives; with synchronous, commits wait instead.
  receiver=$(sql -p 5622 -d postgres -c "SELECT pid FROM pg_stat_wal_receiver")
  at_pause=$(paid 5622)
  kill -STOP "$receiver"
  sleep 1
  at_crash=$(paid 5621)
  as_postgres "$PG_BINDIR/pg_ctl" -D "$primary" -m immediate stop >/dev/null
  kill -CONT "$receiver"
  as_postgres "$PG_BINDIR/pg_ctl" -D "$standby" -w promote >/dev/null

  # Until the broker has nothing left, ready or unacked, and the payments stop growing.
  last=-1
  for _ in $(seq 1 600); do
    read -r ready consumers <<<"$(broker status "$queue")"
    now=$(paid 5622)
    [[ $ready == 0 && $now == "$last" ]] && break
    last=$now
    sleep 0.5
  done
  kill "$supervisor" 2>/dev/null || true
  wait "$supervisor" 2>/dev/null || true
  supervisor=''
  pkill -f "failover-consumer-$$" 2>/dev/null || true
  for _ in $(seq 1 100); do
    read -r ready consumers <<<"$(broker status "$queue")"
    [[ $consumers == 0 ]] && break
    sleep 0.1
  done
  [[ $ready == 0 ]] || fail "$mode: $ready messages never consumed"
  broker delete "$queue"

  read -r payments lost doubled sum <<<"$(sql -p 5622 -d failover -F ' ' -c "
    SELECT count(*), $KEYS - count(DISTINCT order_id),
           (SELECT count(*) FROM (SELECT order_id FROM payments GROUP BY 1 HAVING count(*) > 1) d),
           coalesce(sum(amount), 0)
    FROM payments")"
  restarts=$(grep -c 'Traceback' "$dir/consumer.log" || true)
  echo "failover $mode: $((2 * KEYS)) deliveries of $KEYS payments; standby paused at $at_pause paid," \
    "primary stopped at $at_crash; consumer restarted $restarts times; on the promoted standby" \
    "$payments payments, $lost lost, $doubled doubled"
  [[ $doubled == 0 ]] || fail "$mode: $doubled payments applied twice"
  if [ "$mode" = sync ]; then
    [[ $lost == 0 && $sum == "$expected_sum" ]] ||
      fail "sync: $lost payments lost (sum $sum, published $expected_sum)"
  else
    # Only what the primary committed while the standby was paused can be lost.
    (( lost <= at_crash - at_pause )) || fail "async: $lost lost, more than the $((at_crash - at_pause)) committed unreplicated"
  fi
  as_postgres "$PG_BINDIR/pg_ctl" -D "$standby" -m fast stop >/dev/null
  for log in "$dir/primary.log" "$dir/standby.log"; do bash tests/leak_sentinel.sh "$log" "$MAJOR"; done
done
