#!/usr/bin/env bash
# The outbox under a steady load: senders (bench/send_ext.sql at a fixed rate), two
# idempotency-relays draining to RabbitMQ, and the purge every PURGE_EVERY seconds with the
# outbox's retention at OUTBOX_RETENTION, for STEADY_SECONDS. Prints the outbox's size every 10
# s and, over the samples after the first two minutes, the largest against the smallest: the
# target is within 20 %. The bench cluster runs with autovacuum off, so each purge is followed
# by the VACUUM that autovacuum would otherwise run. Run by bench/run.sh (its cluster's PGHOST
# etc.) after the drain bench.
#
#   STEADY_SECONDS (600), STEADY_RATE (sends per second, 300), OUTBOX_RETENTION (30s),
#   PURGE_EVERY (10); AMQP_URL etc.: see bench/relays.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STEADY_SECONDS=${STEADY_SECONDS:-600}
STEADY_RATE=${STEADY_RATE:-300}
OUTBOX_RETENTION=${OUTBOX_RETENTION:-30s}
PURGE_EVERY=${PURGE_EVERY:-10}
WARMUP=120

source "$HERE/relays.sh"
# The relays publish to the default exchange, which delivers to the queue named like the topic.
use_queue orders.paid

sql -c "TRUNCATE idempotency.outbox, idempotency.ledger, biz_ext" -c "ALTER DATABASE $DB SET idempotency.outbox_retention = '$OUTBOX_RETENTION'"

echo "-- steady load: $STEADY_RATE sends/s (claim + insert + idem_send), 2 relays to RabbitMQ, purge every ${PURGE_EVERY}s (retention $OUTBOX_RETENTION) then VACUUM, for ${STEADY_SECONDS}s --"
pgbench -n -M prepared -c 2 -j 2 -R "$STEADY_RATE" -T "$STEADY_SECONDS" -f "$HERE/send_ext.sql" "$DB" >/dev/null 2>&1 &
PIDS+=($!)
for _ in 1 2; do
  "$BIN/idempotency-relay" --database-url "$DATABASE_URL" --amqp-url "$AMQP_URL" --route "$QUEUE=rabbitmq" --log-every-s 3600 2>/dev/null &
  PIDS+=($!)
done
(
  while true; do
    sleep "$PURGE_EVERY"
    sql -c "CALL idem_purge(pause => '100 ms')" >/dev/null
    sql -c "VACUUM idempotency.outbox" >/dev/null
  done
) &
PIDS+=($!)

samples=''
for ((t = 10; t <= STEADY_SECONDS; t += 10)); do
  sleep 10
  # The parts, so that a size that moves says which of them moved.
  IFS='|' read -r bytes heap pkey pending_index rows pending <<<"$(sql -c "SELECT pg_total_relation_size('idempotency.outbox'), pg_relation_size('idempotency.outbox') / 1024, pg_relation_size('idempotency.outbox_pkey') / 1024, pg_relation_size('idempotency.outbox_pending') / 1024, (SELECT count(*) FROM idempotency.outbox), (SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NULL)")"
  printf '  t=%4ds  outbox %8.1f kB (heap %d, outbox_pkey %d, outbox_pending %d), %6d rows, %5d pending\n' \
    "$t" "$(awk -v b="$bytes" 'BEGIN { print b / 1024 }')" "$heap" "$pkey" "$pending_index" "$rows" "$pending"
  [ "$t" -gt "$WARMUP" ] && samples+=" $bytes"
done
echo "$samples" | tr ' ' '\n' | { grep -v '^$' || true; } | awk -v warm="$WARMUP" '
  NR == 1 { min = $1; max = $1 } { if ($1 < min) min = $1; if ($1 > max) max = $1 }
  END {
    if (NR == 0) { print "steady: too short to judge (no sample after the first " warm "s)"; exit }
    r = max / min
    printf "steady: outbox size after the first %ds between %.0f and %.0f kB, largest / smallest %.2f   target <= 1.20   %s\n",
      warm, min / 1024, max / 1024, r, (r <= 1.20) ? "PASS" : "MISS"
  }'
sql -c "ALTER DATABASE $DB RESET idempotency.outbox_retention"
