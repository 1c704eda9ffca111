# What bench/drain.sh and bench/steady.sh share (sourced, after HERE is set): the database and
# the broker, the relay's build, a queue of their own that the relays publish to, and the
# clean-up of the processes they start (listed in PIDS) and of that queue on exit.
#
#   AMQP_URL (the machine's RabbitMQ), BENCH_DBNAME, RELAY_PROFILE (release; debug for make
#   test's short run, which has built it)
AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672}
DB=${BENCH_DBNAME:-idem_bench}
DATABASE_URL="host=${PGHOST:-127.0.0.1} port=${PGPORT:-5432} user=${PGUSER:-postgres} dbname=$DB${PGPASSWORD:+ password=$PGPASSWORD}"
PROFILE=${RELAY_PROFILE:-release}
cargo build $([ "$PROFILE" = release ] && echo --release) -q -p idempotency-relay \
  --bin idempotency-relay --example hand_relay --example queue
BIN=$(cd "$HERE/.." && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/$PROFILE
PIDS=()

sql() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$DB" "$@"; }

# use_queue NAME: declares the queue now and deletes it on exit, after the processes in PIDS.
use_queue() {
  QUEUE=$1
  "$BIN/examples/queue" "$AMQP_URL" declare "$QUEUE"
  trap 'for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
        wait 2>/dev/null || true
        "$BIN/examples/queue" "$AMQP_URL" delete "$QUEUE" || true' EXIT
}
