#!/usr/bin/env bash
# Drain rate to RabbitMQ: idempotency-relay against the hand-written SKIP LOCKED relay
# (relay/examples/hand_relay.rs: same batch size, same publisher confirms), with 1 and with 4
# relays, and with each of DRAIN_KEYS ordering keys. Each round fills the outbox with
# DRAIN_MESSAGES messages over that many ordering keys, starts the relays, and times them until
# nothing is pending; the contenders alternate round by
# round and the summary takes the median. Run by bench/run.sh (inside its cluster: PGHOST,
# PGPORT, PGUSER are set), after the pgbench contenders.
#
# A key's messages are published one at a time, each after the broker confirmed the one before,
# so a backlog can have at most as many messages in flight as it has keys: with 200 keys four
# relays share 200 messages in flight, where four hand-written relays, which keep no order, have
# 400. 2000 keys is a backlog of many entities, as an outbox of orders or accounts has. Where the
# keys are fewer than the relays' batches hold, each round also times the hand-written relays with
# batches of KEYS / RELAYS, so that they too have at most KEYS messages in flight: an informational
# row that separates what ordering costs (fewer messages in flight) from what the relay costs.
#
#   DRAIN_MESSAGES (default 20000), DRAIN_KEYS (default "200 2000"), DRAIN_ROUNDS (default 3);
#   AMQP_URL etc.: see bench/relays.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DRAIN_MESSAGES=${DRAIN_MESSAGES:-20000}
DRAIN_ROUNDS=${DRAIN_ROUNDS:-3}
DRAIN_KEYS=${DRAIN_KEYS:-200 2000}
BATCH=100
source "$HERE/relays.sh"
use_queue "idem_bench_drain_$$"

fill() {  # fill ext|hand KEYS
  sql -c "TRUNCATE idempotency.outbox, hand_outbox"
  if [ "$1" = ext ]; then
    sql -c "SELECT count(idem_send('$QUEUE', jsonb_build_object('amount', 10, 'n', n), ordering_key => 'order-' || (n % $2), key => 'drain-' || n)) FROM generate_series(1, $DRAIN_MESSAGES) AS n" >/dev/null
  else
    sql -c "INSERT INTO hand_outbox (id, topic, ordering_key, payload) SELECT gen_random_uuid(), '$QUEUE', 'order-' || (n % $2), jsonb_build_object('amount', 10, 'n', n) FROM generate_series(1, $DRAIN_MESSAGES) AS n"
  fi
  sql -c "VACUUM ANALYZE idempotency.outbox" ; sql -c "VACUUM ANALYZE hand_outbox"
  "$BIN/examples/queue" "$AMQP_URL" purge "$QUEUE"
}
# One psql session answers every poll: a psql started for each (fifty a second) took a fifth
# of the machine's two cores from the relays it was timing.
coproc POLL { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$DB"; }
PIDS=("$POLL_PID")
pending() {  # pending ext|hand
  if [ "$1" = ext ]; then echo "SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NULL;"; else echo "SELECT count(*) FROM hand_outbox;"; fi >&"${POLL[1]}"
  local n
  read -r n <&"${POLL[0]}"
  echo "$n"
}
drain() {  # drain ext|hand RELAYS KEYS [HAND_BATCH]: prints messages per second
  local start end i relays=()
  fill "$1" "$3"
  start=$(date +%s.%N)
  for ((i = 0; i < $2; i++)); do
    if [ "$1" = ext ]; then
      "$BIN/idempotency-relay" --database-url "$DATABASE_URL" --amqp-url "$AMQP_URL" --route "$QUEUE=rabbitmq" \
        --batch-size $BATCH --log-every-s 3600 2>/dev/null &
    else
      "$BIN/examples/hand_relay" "$DATABASE_URL" "$AMQP_URL" "${4:-$BATCH}" &
    fi
    relays+=($!)
  done
  while [ "$(pending "$1")" != 0 ]; do sleep 0.02; done
  end=$(date +%s.%N)
  for p in "${relays[@]}"; do kill -TERM "$p"; done
  wait "${relays[@]}" 2>/dev/null || true
  awk -v n="$DRAIN_MESSAGES" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f", n / (e - s) }'
}
source "$HERE/stats.sh"

echo "-- drain to RabbitMQ: $DRAIN_MESSAGES messages over $DRAIN_KEYS ordering keys, batches of $BATCH, publisher confirms, $DRAIN_ROUNDS alternating rounds --"
for keys in $DRAIN_KEYS; do
  for relays in 1 4; do
    ext_rates='' hand_rates='' ratios='' equal_rates='' equal_ratios=''
    equal=$((keys < relays * BATCH ? keys / relays : 0))
    for ((r = 1; r <= DRAIN_ROUNDS; r++)); do
      e=$(drain ext $relays $keys); h=$(drain hand $relays $keys)
      ext_rates+=" $e" hand_rates+=" $h" ratios+=" $(awk -v a="$e" -v b="$h" 'BEGIN { printf "%.3f", a / b }')"
      echo "  $keys keys, $relays relay(s), round $r: idempotency-relay $e msg/s, hand-written SKIP LOCKED $h msg/s"
      if ((equal > 0)); then
        q=$(drain hand $relays $keys $equal)
        equal_rates+=" $q" equal_ratios+=" $(awk -v a="$e" -v b="$q" 'BEGIN { printf "%.3f", a / b }')"
        echo "  … hand-written with batches of $equal: $q msg/s"
      fi
    done
    em=$(echo "$ext_rates" | median); hm=$(echo "$hand_rates" | median); rm_=$(echo "$ratios" | median)
    verdict=$(awk -v x="$rm_" 'BEGIN { print (x >= 1.0) ? "PASS" : "MISS" }')
    printf 'drain, %d keys, %d relay(s): idempotency-relay %.0f msg/s, hand %.0f msg/s, ratio %.2f (rounds:%s)   target >= 1.00   %s\n' \
      "$keys" "$relays" "$em" "$hm" "$rm_" "$ratios" "$verdict"
    if ((equal > 0)); then
      printf 'drain, %d keys, %d relay(s), as many in flight: idempotency-relay %.0f msg/s, hand with batches of %d %.0f msg/s, ratio %.2f (rounds:%s)\n' \
        "$keys" "$relays" "$em" "$equal" "$(echo "$equal_rates" | median)" "$(echo "$equal_ratios" | median)" "$equal_ratios"
    fi
  done
done
