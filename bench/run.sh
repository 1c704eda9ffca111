#!/usr/bin/env bash
# Benchmark of the idempotency extension against a hand-written ledger table.
#
# Run by `make bench`:
#   - with $DATABASE_URL set: against that server (needs a role that may CREATE DATABASE and
#     CREATE EXTENSION idempotency, i.e. a superuser);
#   - otherwise in a throwaway cluster reached over TCP to localhost: pg_virtualenv's for the
#     system's 15, tests/own-server.sh's for PG_MAJOR=18 (see the Makefile); either sets
#     PGHOST/PGPORT/PGUSER, so plain psql/pgbench connect.
#
# Settings (environment):
#   BENCH_SECONDS  seconds of each mixed pgbench run     (default 5)
#   BENCH_ROUNDS   rounds of the three mixed runs        (default 16)
#   PURGE_ROUNDS   rounds of claims beside a purge       (default 3)
#   BENCH_CLIENTS  pgbench clients (= threads)           (default 2)
#   BENCH_KEYS     keys retained for the size measurement (default 200000)
#   PURGE_KEYS     expired claims for the purge-rate measurement (default 1000000)
#   PURGE_SECONDS  seconds of each claims-beside-a-purge round (default 5)
#   CONSUMER_CLIENTS pgbench clients of the consumer-transaction run   (default 4)
#   BENCH_TSV      where the summary's rows go, for bench/report.py
#                  (default docs/bench/bench-pgNN.tsv, committed, so that a run on one version
#                  keeps the other version's figures in the report)
#
# The pgbench scripts are the files bench/claim_*.sql and bench/vupdate_*.sql; the schema of
# the hand-written contenders is bench/setup.sql. Contenders that are compared share one
# pgbench run (see "throughput" below). Targets are informational: the script exits 0 on MISS.
set -euo pipefail

BENCH_SECONDS=${BENCH_SECONDS:-5}
BENCH_ROUNDS=${BENCH_ROUNDS:-16}
PURGE_ROUNDS=${PURGE_ROUNDS:-3}
BENCH_CLIENTS=${BENCH_CLIENTS:-2}
BENCH_KEYS=${BENCH_KEYS:-200000}
PURGE_KEYS=${PURGE_KEYS:-1000000}      # expired claims the purge-rate measurement deletes
PURGE_SECONDS=${PURGE_SECONDS:-5}      # length of each claims-beside-a-purge round
CONSUMER_CLIENTS=${CONSUMER_CLIENTS:-4}
PURGE_PAUSE='100 ms'                   # what idem_schedule_purge() passes by default
BATCH=500          # keys per idem_claim_many call in the throughput test (see claim_many.sql)
FILL_BATCH=10000   # keys per statement when filling the tables for the size measurement
BENCH_DBNAME=idem_bench

for v in BENCH_SECONDS BENCH_ROUNDS PURGE_ROUNDS BENCH_CLIENTS BENCH_KEYS PURGE_KEYS PURGE_SECONDS CONSUMER_CLIENTS; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "bench: $v must be a positive integer, got '${!v}'" >&2
    exit 2
  fi
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# --- connections -------------------------------------------------------------------------
# ADMIN_DB: where CREATE/DROP DATABASE run; BENCH_DB: the benchmark database. Both are
# passed to psql -d / pgbench as a database name or a connection string.
if [ -n "${DATABASE_URL:-}" ]; then
  ADMIN_DB=$DATABASE_URL
  if [[ $DATABASE_URL =~ ^(postgres(ql)?://[^/?]*)(/[^?]*)?(\?.*)?$ ]]; then
    BENCH_DB="${BASH_REMATCH[1]}/${BENCH_DBNAME}${BASH_REMATCH[4]}"
  else
    # keyword=value connection string: a later keyword overrides an earlier one.
    BENCH_DB="$DATABASE_URL dbname=$BENCH_DBNAME"
  fi
  MODE='DATABASE_URL'
else
  ADMIN_DB=postgres
  BENCH_DB=$BENCH_DBNAME
  MODE='pg_virtualenv (throwaway cluster)'
fi

psql_admin() { psql -X -q -v ON_ERROR_STOP=1 -d "$ADMIN_DB" "$@"; }
psql_bench() { psql -X -q -v ON_ERROR_STOP=1 -d "$BENCH_DB" "$@"; }
# One value, unaligned, no headers.
scalar() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$BENCH_DB" -c "$1"; }

# --- database ----------------------------------------------------------------------------
psql_admin -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $BENCH_DBNAME WITH (FORCE)"
psql_admin -c "CREATE DATABASE $BENCH_DBNAME"
psql_admin -c "ALTER DATABASE $BENCH_DBNAME SET synchronous_commit = off"
psql_bench -c "CREATE EXTENSION idempotency"
psql_bench -f "$HERE/setup.sql"

PGBENCH_OPTS=(-n -M prepared -c "$BENCH_CLIENTS" -j "$BENCH_CLIENTS" -T "$BENCH_SECONDS")
# The consumer run commits as a consumer does, waiting for its WAL to be flushed: the
# connection's own setting overrides the benchmark database's synchronous_commit = off.
CONSUMER_OPTS=(-n -M prepared -c "$CONSUMER_CLIENTS" -j "$CONSUMER_CLIENTS" -T "$BENCH_SECONDS")
CONSUMER_PGOPTIONS="${PGOPTIONS:-} -c synchronous_commit=on"
BENCH_TSV=${BENCH_TSV:-$HERE/../docs/bench/bench-pg$(( $(scalar 'SHOW server_version_num') / 10000 )).tsv}
mkdir -p "$(dirname "$BENCH_TSV")"

# --- header ------------------------------------------------------------------------------
echo "== idempotency benchmark =="
SETTINGS_ENV="BENCH_SECONDS=$BENCH_SECONDS BENCH_ROUNDS=$BENCH_ROUNDS PURGE_ROUNDS=$PURGE_ROUNDS BENCH_CLIENTS=$BENCH_CLIENTS BENCH_KEYS=$BENCH_KEYS PURGE_KEYS=$PURGE_KEYS PURGE_SECONDS=$PURGE_SECONDS"
echo "invoked as:        $SETTINGS_ENV $0 $*"
echo "mode:              $MODE"
# The transport weighs on the ratios: a claim answers with a row, the hand INSERT with its
# command tag only, and the row costs more over TCP than over a Unix socket. `make bench`
# connects over TCP to localhost without TLS on every version.
case ${PGHOST:-} in
  /*|'') echo "connection:        Unix socket ${PGHOST:-in the default directory}" ;;
  *)     echo "connection:        TCP to $PGHOST, TLS $(scalar 'SELECT CASE WHEN ssl THEN version ELSE $$off$$ END FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()')" ;;
esac
if [ -z "${DATABASE_URL:-}" ]; then
  echo "reproduce with:    $SETTINGS_ENV make bench PG_MAJOR=$(( $(scalar 'SHOW server_version_num') / 10000 ))"
else
  echo "reproduce with:    $SETTINGS_ENV DATABASE_URL=... make bench"
fi
echo "pgbench command:   pgbench ${PGBENCH_OPTS[*]} -l -f bench/<hand>.sql@1 -f bench/<extension>.sql@1 $BENCH_DBNAME"
echo "server version:    $(scalar 'SHOW server_version')"
echo "pgbench version:   $(pgbench --version)"
echo "synchronous_commit: server $(psql -X -A -t -d "$ADMIN_DB" -c 'SHOW synchronous_commit'), in $BENCH_DBNAME $(scalar 'SHOW synchronous_commit')"
echo "fsync:             $(scalar 'SHOW fsync')"
echo "autovacuum:        $(scalar 'SHOW autovacuum') (the tables are vacuumed before every run instead)"
echo "shared_preload_libraries: $(scalar 'SHOW shared_preload_libraries')"
echo "max_wal_size:      $(scalar 'SHOW max_wal_size')"
echo "shared_buffers:    $(scalar 'SHOW shared_buffers')"
echo "clients/threads:   $BENCH_CLIENTS"
echo "seconds per round: $BENCH_SECONDS"
echo "rounds:            $BENCH_ROUNDS, each of a mixed claims run (hand, ext, plpgsql, hand RETURNING), a single-claim and a"
echo "                   batch run, a mixed versioned-update run (hand, ext, ext with JSON text) and a mixed outbox-send run (hand"
echo "                   INSERT, idem_send, each after a claim and a business insert), a mixed watermark run (hand"
echo "                   offset UPDATE, idem_watermark_advance), a mixed diagnostics run and a mixed consumer run;"
echo "                   a mixed run interleaves its"
echo "                   contenders transaction by transaction and a ratio compares their mean latencies in"
echo "                   it; the summary takes the median of the rounds' ratios"
echo "consumer run:      $CONSUMER_CLIENTS clients, synchronous_commit $(PGOPTIONS=$CONSUMER_PGOPTIONS scalar 'SHOW synchronous_commit'): BEGIN, dedup, INSERT a payment,"
echo "                   UPDATE its account, COMMIT, with no dedup, hand dedup, idem_claim alone, the claim"
echo "                   inside the INSERT, and the whole effect in one statement, pipelined"
echo "keys for size:     $BENCH_KEYS (batches of $FILL_BATCH, random UUID text keys)"
echo "machine:           $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo

# --- throughput --------------------------------------------------------------------------
# A statement and the hand-written SQL it replaces run in ONE pgbench run: for every
# transaction each client picks one of the run's scripts at random (pgbench -f a.sql@1
# -f b.sql@1), so whatever the machine does during the run weighs on all of them alike.
# pgbench logs every transaction's latency (-l); a contender's cost is its mean latency in
# the run, and a ratio compares two means of the same run: hand / extension, so above 1
# means the extension is faster. The 500-key batch is not mixed with single claims (a batch
# on one core would only measure how it slows the other core's short transactions); it is
# compared by keys/s with a run of single claims just before it.
declare -A RUN=(
  [claims]="claim_hand.sql claim_ext.sql claim_plpgsql.sql claim_hand_returning.sql"
  [versioned]="vupdate_hand.sql vupdate_ext.sql vupdate_ext_text.sql"
  [send]="send_hand.sql send_ext.sql send_notify.sql"
  [watermarks]="watermark_hand.sql watermark_ext.sql"
  [diagnostics]="claim_diag_off.sql claim_diag_on.sql dup_diag_off.sql dup_diag_on.sql"
  [consumer]="consumer_none.sql consumer_hand.sql consumer_claim.sql consumer_one_statement.sql consumer_pipeline.sql"
)
RUNS=(claims batch versioned send watermarks diagnostics consumer)
declare -A LAT=()     # run:script -> space-separated mean latency (µs) of each round
declare -A RATIOS=()  # measure -> space-separated ratio of each round
SINGLE_TPS='' MANY_TPS=''

reset_tables() { psql_bench -f "$HERE/reset.sql"; }

# After a versioned-update run: each table must hold only consistent rows (status
# 's' || version, as both scripts write them) and some writes must have landed; a contender
# that silently wrote nothing (or wrote wrong rows) must not produce a figure.
check_versioned() {  # check_versioned TABLE
  local written consistent
  IFS='|' read -r written consistent <<<"$(scalar "SELECT count(*) FILTER (WHERE version > 0), bool_and(status = 's' || version) FROM $1")"
  if [ "$consistent" != t ] || [ "$written" -eq 0 ]; then
    echo "bench: $1 after its run: $written rows written, rows consistent: $consistent" >&2
    return 1
  fi
}

# Fails with pgbench's output when it failed or reported failed transactions.
check_pgbench() {  # check_pgbench WHAT STATUS OUTPUT
  local failed
  failed=$(printf '%s\n' "$3" | sed -nE 's/^number of failed transactions: ([0-9]+).*/\1/p' | head -n1)
  if [ "$2" != 0 ] || { [ -n "$failed" ] && [ "$failed" != 0 ]; }; then
    echo "bench: pgbench failed for $1:" >&2
    echo "$3" >&2
    return 1
  fi
}

# Runs one pgbench over SCRIPTS mixed with equal weights and prints, per script in the order
# given, "SCRIPT MEAN_LATENCY_US TRANSACTIONS" from the per-transaction log.
run_mixed() {  # run_mixed SCRIPT...
  local logs out status=0 args=() s
  logs=$(mktemp -d)
  for s in "$@"; do args+=(-f "$HERE/$s@1"); done
  out=$(pgbench "${PGBENCH_OPTS[@]}" -l --log-prefix="$logs/log" "${args[@]}" "$BENCH_DB" 2>&1) || status=$?
  check_pgbench "$*" "$status" "$out" || { rm -rf "$logs"; return 1; }
  # Log lines: client_id transaction_no latency_us script_no time_epoch time_us
  cat "$logs"/log.* | awk -v names="$*" '
    { n[$4]++; sum[$4] += $3 }
    END {
      count = split(names, script, " ")
      for (i = 1; i <= count; i++) {
        if (n[i - 1] == 0) { printf "bench: %s ran no transaction\n", script[i] > "/dev/stderr"; exit 1 }
        printf "%s %.2f %d\n", script[i], sum[i - 1] / n[i - 1], n[i - 1]
      }
    }'
  status=$?
  rm -rf "$logs"
  return $status
}

# Runs a tps-only pgbench (one script) and prints its tps, excluding connection time.
run_pgbench() {  # run_pgbench SCRIPT
  local out tps status=0
  out=$(pgbench "${PGBENCH_OPTS[@]}" -f "$HERE/$1" "$BENCH_DB" 2>&1) || status=$?
  check_pgbench "$1" "$status" "$out" || return 1
  tps=$(printf '%s\n' "$out" | sed -nE 's/^tps = ([0-9.]+) \((without initial connection time|excluding connections establishing)\).*/\1/p' | head -n1)
  if [ -z "$tps" ]; then
    echo "bench: no tps line in pgbench output for $1:" >&2
    echo "$out" >&2
    return 1
  fi
  echo "$tps"
}

source "$HERE/stats.sh"

ratio() { awk -v a="$1" -v b="$2" -v m="${3:-1}" 'BEGIN { printf "%.3f", a * m / b }'; }

echo "-- throughput: mean latency per transaction (µs) in each round's mixed runs; tps of the batch runs --"
for ((r = 1; r <= BENCH_ROUNDS; r++)); do
  line="round $r:"
  for run in "${RUNS[@]}"; do
    reset_tables
    if [ "$run" = batch ]; then
      single=$(run_pgbench claim_ext.sql)
      reset_tables
      many=$(run_pgbench claim_many.sql)
      SINGLE_TPS+=" $single" MANY_TPS+=" $many"
      RATIOS[many]+=" $(ratio "$many" "$single" "$BATCH")"
      line+=$(printf '  single %.0f tps, batch %.0f tps |' "$single" "$many")
      continue
    fi
    if [ "$run" = consumer ]; then
      results=$(export PGOPTIONS=$CONSUMER_PGOPTIONS; PGBENCH_OPTS=("${CONSUMER_OPTS[@]}"); run_mixed ${RUN[$run]})
    else
      results=$(run_mixed ${RUN[$run]})
    fi
    if [ "$run" = versioned ]; then check_versioned vm_hand; check_versioned vm_ext; fi
    declare -A mean=()
    while read -r script latency _; do
      mean[${script%.sql}]=$latency
      LAT[$run:${script%.sql}]="${LAT[$run:${script%.sql}]:-} $latency"
    done <<<"$results"
    case $run in
      claims)
        RATIOS[claim]+=" $(ratio "${mean[claim_hand]}" "${mean[claim_ext]}")"
        RATIOS[plpgsql]+=" $(ratio "${mean[claim_plpgsql]}" "${mean[claim_ext]}")"
        RATIOS[returning]+=" $(ratio "${mean[claim_hand_returning]}" "${mean[claim_ext]}")"
        line+=$(printf '  hand %.1f ext %.1f plpgsql %.1f returning %.1f |' "${mean[claim_hand]}" "${mean[claim_ext]}" "${mean[claim_plpgsql]}" "${mean[claim_hand_returning]}") ;;
      versioned)
        RATIOS[vupdate]+=" $(ratio "${mean[vupdate_hand]}" "${mean[vupdate_ext]}")"
        RATIOS[vupdate_text]+=" $(ratio "${mean[vupdate_hand]}" "${mean[vupdate_ext_text]}")"
        line+=$(printf '  vupdate_hand %.1f vupdate_ext %.1f vupdate_ext_text %.1f |' "${mean[vupdate_hand]}" "${mean[vupdate_ext]}" "${mean[vupdate_ext_text]}") ;;
      send)
        RATIOS[send]+=" $(ratio "${mean[send_hand]}" "${mean[send_ext]}")"
        RATIOS[notify]+=" $(ratio "${mean[send_ext]}" "${mean[send_notify]}")"
        line+=$(printf '  send_hand %.1f send_ext %.1f send_notify %.1f |' "${mean[send_hand]}" "${mean[send_ext]}" "${mean[send_notify]}") ;;
      watermarks)
        RATIOS[watermark]+=" $(ratio "${mean[watermark_hand]}" "${mean[watermark_ext]}")"
        line+=$(printf '  watermark_hand %.1f watermark_ext %.1f |' "${mean[watermark_hand]}" "${mean[watermark_ext]}") ;;
      diagnostics)
        RATIOS[diag_first]+=" $(ratio "${mean[claim_diag_off]}" "${mean[claim_diag_on]}")"
        RATIOS[diag_dup]+=" $(ratio "${mean[dup_diag_on]}" "${mean[dup_diag_off]}")"
        line+=$(printf '  diagnostics off/on: first %.1f/%.1f duplicate %.1f/%.1f |' "${mean[claim_diag_off]}" "${mean[claim_diag_on]}" "${mean[dup_diag_off]}" "${mean[dup_diag_on]}") ;;
      consumer)
        RATIOS[consumer]+=" $(ratio "${mean[consumer_hand]}" "${mean[consumer_claim]}")"
        line+=$(printf '  consumer none %.0f hand %.0f claim %.0f in-insert %.0f pipelined %.0f' "${mean[consumer_none]}" "${mean[consumer_hand]}" "${mean[consumer_claim]}" "${mean[consumer_one_statement]}" "${mean[consumer_pipeline]}") ;;
    esac
    unset mean
  done
  echo "$line"
done
echo

declare -A MED=() RATIO=()
for key in "${!LAT[@]}"; do MED[$key]=$(echo "${LAT[$key]}" | median); done
MED[single]=$(echo "$SINGLE_TPS" | median)
MED[many]=$(echo "$MANY_TPS" | median)
echo "ratios within each run (the summary judges their median):"
for m in claim plpgsql returning many vupdate vupdate_text send notify watermark diag_first diag_dup consumer; do RATIO[$m]=$(echo "${RATIOS[$m]}" | median); done
printf '  %-44s per round:%s   median %.3f\n' \
  "idem_claim vs hand INSERT (hand/ext µs):" "${RATIOS[claim]}" "${RATIO[claim]}" \
  "idem_claim vs plpgsql claim (plpgsql/ext µs):" "${RATIOS[plpgsql]}" "${RATIO[plpgsql]}" \
  "idem_claim vs hand INSERT … RETURNING:" "${RATIOS[returning]}" "${RATIO[returning]}" \
  "idem_claim_many keys/s / idem_claim keys/s (tps):" "${RATIOS[many]}" "${RATIO[many]}" \
  "idem_versioned_update vs hand UPDATE:" "${RATIOS[vupdate]}" "${RATIO[vupdate]}" \
  "the same, arguments as JSON text:" "${RATIOS[vupdate_text]}" "${RATIO[vupdate_text]}" \
  "claim+insert+idem_send vs hand outbox INSERT:" "${RATIOS[send]}" "${RATIO[send]}" \
  "the same with NOTIFY vs without (ext/notify):" "${RATIOS[notify]}" "${RATIO[notify]}" \
  "idem_watermark_advance vs hand UPDATE:" "${RATIOS[watermark]}" "${RATIO[watermark]}" \
  "first claims, diagnostics off/on (µs):" "${RATIOS[diag_first]}" "${RATIO[diag_first]}" \
  "duplicates, diagnostics on/off (µs):" "${RATIOS[diag_dup]}" "${RATIO[diag_dup]}" \
  "consumer tx, hand dedup vs idem_claim (µs):" "${RATIOS[consumer]}" "${RATIO[consumer]}"
echo

# --- bytes per retained key --------------------------------------------------------------
echo "-- size: filling both tables with $BENCH_KEYS keys --"
reset_tables
{
  left=$BENCH_KEYS
  while [ "$left" -gt 0 ]; do
    n=$(( left < FILL_BATCH ? left : FILL_BATCH ))
    echo "SELECT count(*) FROM unnest(idem_claim_many(ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1,$n))));"
    echo "INSERT INTO hand_ledger (scope, key) SELECT 'default', gen_random_uuid()::text FROM generate_series(1,$n) ON CONFLICT DO NOTHING;"
    left=$(( left - n ))
  done
} | psql_bench -o /dev/null -f -
psql_bench -c "VACUUM idempotency.ledger" -c "VACUUM hand_ledger"

# name|rows|total|heap|indexes
size_row() {
  scalar "SELECT '$2', count(*), pg_total_relation_size('$1'), pg_relation_size('$1'), pg_indexes_size('$1') FROM $1"
}
IFS='|' read -r _ EXT_ROWS EXT_TOTAL EXT_HEAP EXT_IDX <<<"$(size_row idempotency.ledger ledger)"
IFS='|' read -r _ HAND_ROWS HAND_TOTAL HAND_HEAP HAND_IDX <<<"$(size_row hand_ledger hand)"

awk -v er="$EXT_ROWS" -v et="$EXT_TOTAL" -v eh="$EXT_HEAP" -v ei="$EXT_IDX" \
    -v hr="$HAND_ROWS" -v ht="$HAND_TOTAL" -v hh="$HAND_HEAP" -v hi="$HAND_IDX" 'BEGIN {
  printf "%-20s %10s %14s %14s %14s %10s %10s %10s\n", "table", "rows", "total bytes", "heap bytes", "index bytes", "total/key", "heap/key", "index/key"
  printf "%-20s %10d %14d %14d %14d %10.1f %10.1f %10.1f\n", "idempotency.ledger", er, et, eh, ei, et/er, eh/er, ei/er
  printf "%-20s %10d %14d %14d %14d %10.1f %10.1f %10.1f\n", "hand_ledger", hr, ht, hh, hi, ht/hr, hh/hr, hi/hr
}'
echo


# --- retention -----------------------------------------------------------------------------
# Expired claims are written straight into the ledger, 30 days old, as the purge finds them
# after a month of traffic.
fill_expired() {  # fill_expired N
  psql_bench -c "TRUNCATE idempotency.ledger" \
    -c "INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at)
        SELECT idem_digest('expired-' || g), s.id, now() - interval '30 days'
        FROM generate_series(1, $1) AS g, (SELECT idem_scope_id('default') AS id) AS s" \
    -c "VACUUM ANALYZE idempotency.ledger" -c "CHECKPOINT"
}
now_s() { date +%s.%N; }

echo "-- retention: purge rate for $PURGE_KEYS expired claims --"
fill_expired "$PURGE_KEYS"
t0=$(now_s)
PURGED=$(scalar "CALL idem_purge()")
t1=$(now_s)
PURGE_RATE=$(awk -v n="$PURGED" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", n/(b-a)}')
PURGE_TIME=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')
echo "CALL idem_purge(): deleted $PURGED in ${PURGE_TIME}s = $PURGE_RATE claims/s (batches of 256 heap blocks, one commit each)"
echo

# Claims beside a purge: each round fills the ledger with expired claims, measures claims
# alone, then claims while the purge (two conditions, so two runs compared by tps), run as the pg_cron job runs it (pausing between
# batches), deletes them, in a loop that keeps it running for the whole window.
PURGE_FILL=$(( PURGE_KEYS + PURGE_KEYS / 2 ))
echo "-- retention: idem_claim beside a running purge ($PURGE_FILL expired claims, ${PURGE_SECONDS}s windows, CALL idem_purge(pause => '$PURGE_PAUSE')) --"
BESIDE_OPTS=(-n -M prepared -c "$BENCH_CLIENTS" -j "$BENCH_CLIENTS" -T "$PURGE_SECONDS")
ALONE='' BESIDE=''
for ((r = 1; r <= PURGE_ROUNDS; r++)); do
  fill_expired "$PURGE_FILL"
  alone=$(PGBENCH_OPTS=("${BESIDE_OPTS[@]}"); run_pgbench claim_ext.sql)
  end=$(( $(date +%s) + PURGE_SECONDS ))
  ( while [ "$(date +%s)" -lt "$end" ]; do psql_bench -o /dev/null -c "CALL idem_purge(pause => '$PURGE_PAUSE')"; done ) &
  purger=$!
  beside=$(PGBENCH_OPTS=("${BESIDE_OPTS[@]}"); run_pgbench claim_ext.sql)
  wait "$purger"
  left=$(scalar "SELECT count(*) FROM idempotency.ledger WHERE claimed_at < now() - interval '29 days'")
  ALONE+=" $alone"
  BESIDE+=" $beside"
  RATIOS[purge]+=" $(ratio "$beside" "$alone")"
  printf 'round %d:  claims alone %.0f tps  beside a purge %.0f tps  (expired claims left after the window: %s)\n' "$r" "$alone" "$beside" "$left"
done
MED[alone]=$(echo "$ALONE" | median)
MED[beside]=$(echo "$BESIDE" | median)
RATIO[purge]=$(echo "${RATIOS[purge]}" | median)
printf '  %-44s per round:%s   median %.3f\n' "beside a purge / alone (tps):" "${RATIOS[purge]}" "${RATIO[purge]}"
echo "retention index: none. The purge walks the heap by TID ranges, so claims maintain no"
echo "  index for retention: throughput with it = without it (1.00 by construction), and the"
echo "  bytes per key above already are the bytes per key with retention."
echo
# --- outbox drain rate and steady load -----------------------------------------------------
# idempotency-relay against a hand-written SKIP LOCKED relay, to the machine's RabbitMQ
# (bench/drain.sh), then ten minutes of sends, relays and purges (bench/steady.sh, STEADY_SECONDS);
# skipped, and said so, where no RabbitMQ answers.
if (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then
  BENCH_DBNAME=$BENCH_DBNAME bash "$HERE/drain.sh" | tee "${TMPDIR:-/tmp}/idem_bench_drain.$$"
  DRAIN_SUMMARY=$(grep '^drain,' "${TMPDIR:-/tmp}/idem_bench_drain.$$" || true)
  rm -f "${TMPDIR:-/tmp}/idem_bench_drain.$$"
  BENCH_DBNAME=$BENCH_DBNAME bash "$HERE/steady.sh" | tee "${TMPDIR:-/tmp}/idem_bench_steady.$$"
  DRAIN_SUMMARY+=$'\n'$(grep '^steady:' "${TMPDIR:-/tmp}/idem_bench_steady.$$" || true)
  rm -f "${TMPDIR:-/tmp}/idem_bench_steady.$$"
else
  DRAIN_SUMMARY="drain and steady load: skipped, no RabbitMQ at 127.0.0.1:5672"
fi
echo

# --- summary -----------------------------------------------------------------------------
# Printed, and written as tab-separated rows (what, figure, ratio, target, verdict) to
# $BENCH_TSV, from which bench/report.py draws the report's table and chart.
echo "== summary ($BENCH_ROUNDS rounds x ${BENCH_SECONDS}s, $BENCH_CLIENTS clients; latency: median of the rounds' means; ratio: median of the rounds' ratios) =="
{
  printf '#server\tPostgreSQL %s\n' "$(scalar 'SHOW server_version')"
  printf '#date\t%s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
  printf '#machine\t%s cores (%s), %s GiB RAM, load average %s after the run\n' "$(nproc)" \
    "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)" \
    "$(awk '/^MemTotal/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)" "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf '#settings\t%s rounds of %s s, %s clients (consumer run: %s, synchronous_commit on)\n' \
    "$BENCH_ROUNDS" "$BENCH_SECONDS" "$BENCH_CLIENTS" "$CONSUMER_CLIENTS"
} > "$BENCH_TSV"
awk -v tsv="$BENCH_TSV" -v ext="${MED[claims:claim_ext]}" -v hand="${MED[claims:claim_hand]}" -v plp="${MED[claims:claim_plpgsql]}" \
    -v ret="${MED[claims:claim_hand_returning]}" -v rr="${RATIO[returning]}" \
    -v single="${MED[single]}" -v many="${MED[many]}" \
    -v vext="${MED[versioned:vupdate_ext]}" -v vhand="${MED[versioned:vupdate_hand]}" \
    -v vtext="${MED[versioned:vupdate_ext_text]}" -v vtr="${RATIO[vupdate_text]}" \
    -v sext="${MED[send:send_ext]}" -v shand="${MED[send:send_hand]}" -v sr="${RATIO[send]}" \
    -v snot="${MED[send:send_notify]}" -v nr="${RATIO[notify]}" \
    -v wext="${MED[watermarks:watermark_ext]}" -v whand="${MED[watermarks:watermark_hand]}" -v wr="${RATIO[watermark]}" \
    -v dfon="${MED[diagnostics:claim_diag_on]}" -v dfr="${RATIO[diag_first]}" -v ddon="${MED[diagnostics:dup_diag_on]}" -v ddr="${RATIO[diag_dup]}" \
    -v cnone="${MED[consumer:consumer_none]}" -v chand="${MED[consumer:consumer_hand]}" -v cclaim="${MED[consumer:consumer_claim]}" \
    -v cone="${MED[consumer:consumer_one_statement]}" -v cpipe="${MED[consumer:consumer_pipeline]}" -v cr="${RATIO[consumer]}" \
    -v cclients="$CONSUMER_CLIENTS" \
    -v r="${RATIO[claim]}" -v rp="${RATIO[plpgsql]}" -v x="${RATIO[many]}" -v vr="${RATIO[vupdate]}" -v pr="${RATIO[purge]}" \
    -v alone="${MED[alone]}" -v beside="${MED[beside]}" -v prate="$PURGE_RATE" -v pkeys="$PURGED" -v ptime="$PURGE_TIME" \
    -v batch="$BATCH" -v er="$EXT_ROWS" -v et="$EXT_TOTAL" -v hr="$HAND_ROWS" -v ht="$HAND_TOTAL" '
function verdict(ok) { return ok ? "PASS" : "MISS" }
# A judged row: what, figure (its unit in it), ratio, target, whether it is met.
function judged(what, figure, ratio, target, ok) {
  printf "%-32s %16s %7.3f   %-46s %s\n", what, figure, ratio, target, verdict(ok)
  printf "%s\t%s\t%.3f\t%s\t%s\n", what, figure, ratio, target, verdict(ok) >> tsv
  targets++; miss += !ok
}
function informational(what, figure, ratio, note) {
  printf "%-32s %16s %7.2f   %s\n", what, figure, ratio, note
  printf "%s\t%s\t%.2f\t%s\t\n", what, figure, ratio, note >> tsv
}
function us(v) { return sprintf("%.1f µs", v) }
function pct(cost, base) { return sprintf("%+.0f %%", (cost / base - 1) * 100) }
BEGIN {
  printf "%-32s %16s %7s   %s\n", "contender", "figure", "ratio", "target (ratio = hand µs / extension µs, same run)"
  judged("idem_claim", us(ext), r, ">= 1.00 x hand INSERT ON CONFLICT", r >= 1.0)
  informational("hand INSERT ON CONFLICT", us(hand), 1.0, "")
  informational("hand INSERT … RETURNING", us(ret), hand / ret, sprintf("idem_claim vs it = %.2f (a row costs what a tag does not)", rr))
  judged("plpgsql claim", us(plp), rp, "idem_claim >= 1.00 x plpgsql", rp >= 1.0)
  judged("idem_claim_many (" batch ")", sprintf("%.0f keys/s", many * batch), x, sprintf(">= 10 x single idem_claim (%.0f/s)", single), x >= 10)
  judged("idem_versioned_update", us(vext), vr, ">= 0.90 x hand conditional UPDATE", vr >= 0.90)
  informational("hand conditional UPDATE", us(vhand), 1.0, "")
  informational("… arguments as JSON text", us(vtext), vtr, "as a driver sends jsonb parameters, not built by jsonb_build_object")
  judged("claim + insert + idem_send", us(sext), sr, ">= 0.95 x with a hand outbox INSERT", sr >= 0.95)
  informational("claim + insert + hand INSERT", us(shand), 1.0, "")
  informational("… + idem_send + NOTIFY", us(snot), shand / snot, sprintf("NOTIFY costs the send %.0f %% (relays poll)", (1 / nr - 1) * 100))
  judged("idem_watermark_advance", us(wext), wr, ">= 1.00 x hand UPDATE … WHERE position < p", wr >= 1.0)
  informational("hand offset UPDATE", us(whand), 1.0, "")
  judged("first claim, diagnostics on", us(dfon), dfr, ">= 0.97 x with diagnostics off", dfr >= 0.97)
  judged("duplicate, diagnostics on", us(ddon), ddr, "<= 1.50 x with diagnostics off (cost ratio)", ddr <= 1.5)
  judged("consumer tx, idem_claim", us(cclaim), cr, sprintf(">= 1.00 x hand dedup (sync commit, %d clients)", cclients), cr >= 1.0)
  informational("consumer tx, hand dedup", us(chand), 1.0, pct(chand, cnone) " against no dedup")
  informational("consumer tx, no dedup", us(cnone), chand / cnone, "")
  informational("consumer tx, claim alone", us(cclaim), chand / cclaim, pct(cclaim, cnone) " against no dedup")
  informational("consumer tx, claim in INSERT", us(cone), chand / cone, pct(cone, cnone) " against no dedup, one round trip fewer")
  informational("consumer tx, pipelined", us(cpipe), chand / cpipe, pct(cpipe, cnone) " against no dedup, one round trip")
  bl = et / er; bh = ht / hr; br = bl / bh
  judged("bytes per key", sprintf("%.1f B", bl), br, sprintf("<= 0.70 x hand (%.1f B)", bh), br <= 0.70)
  informational("purge", sprintf("%d claims/s", prate), 1.0, sprintf("%d expired claims in %.2fs", pkeys, ptime))
  judged("idem_claim beside a purge", sprintf("%.0f tps", beside), pr, ">= 0.80 x idem_claim alone", pr >= 0.80)
  informational("idem_claim alone", sprintf("%.0f tps", alone), 1.0, "")
  judged("claims with retention index", "(none)", 1.0, ">= 0.95 x without it", 1)
  printf "targets: %d PASS, %d MISS%s\n", targets - miss, miss, miss ? "   <-- MISS (informational; exit status stays 0)" : ""
}'
echo "$DRAIN_SUMMARY"
# The drain and steady-load lines, as rows of the same file.
printf '%s\n' "$DRAIN_SUMMARY" | sed -nE \
  -e 's/^drain, ([0-9]+) keys, ([0-9]+) relay\(s\): idempotency-relay ([0-9]+) msg\/s, hand ([0-9]+) msg\/s, ratio ([0-9.]+) .*target (>= [0-9.]+) +(PASS|MISS)$/drain, \1 keys, \2 relay(s)\t\3 msg\/s\t\5\t\6 x hand SKIP LOCKED (\4 msg\/s)\t\7/p' \
  -e 's/^drain, ([0-9]+) keys, ([0-9]+) relay\(s\), as many in flight: idempotency-relay ([0-9]+) msg\/s, hand with batches of ([0-9]+) ([0-9]+) msg\/s, ratio ([0-9.]+) .*$/drain, \1 keys, \2 relay(s), as many in flight\t\3 msg\/s\t\6\tx hand SKIP LOCKED with batches of \4, at most \1 in flight as ordering allows (\5 msg\/s)\t/p' \
  -e 's/^steady: outbox size after the first ([0-9]+)s between ([0-9]+) and ([0-9]+) kB, largest \/ smallest ([0-9.]+) +target (<= [0-9.]+) +(PASS|MISS)$/steady outbox size\t\2–\3 kB\t\4\t\5 largest \/ smallest\t\6/p' \
  >> "$BENCH_TSV"
