#!/usr/bin/env bash
# Soak: claims, versioned updates, outbox sends and relays (take + sent) on 8 pgbench
# connections for SOAK_SECONDS, beside a session that calls CALL idem_purge() every
# SOAK_PURGE_EVERY seconds. Prints the throughput per minute and operation and, per backend,
# its memory after the warm-up and at the end; fails when a backend's private memory grew by
# more than SOAK_MAX_GROWTH percent in between, or on any pgbench error.
#
# Private memory is PostgreSQL's own accounting: the "Grand total" that
# pg_log_backend_memory_contexts(pid) writes to the server log. Pss and Anonymous from
# /proc/PID/smaps_rollup are printed beside it but not judged: both grow as a backend
# touches more shared_buffers pages, which is no leak.
#
# Run by `make soak` (30 minutes) and, in its 2-minute form, by tests/run-in-cluster.sh,
# inside a pg_virtualenv cluster (PGHOST/PGPORT/PGUSER set). It reads the server log, so it
# runs on the server's machine, as root or the postgres user.
#
# Settings (environment):
#   SOAK_SECONDS      seconds of load                                (default 1800)
#   SOAK_WARMUP       seconds before the first memory sample         (default 120)
#   SOAK_MAX_GROWTH   percent a backend's memory may grow            (default 5)
#   SOAK_PURGE_EVERY  seconds between two purges                     (default 5)
#   SOAK_LOG          the server log (default: the pg_virtualenv cluster's, from pg_lsclusters)
set -euo pipefail

SOAK_SECONDS=${SOAK_SECONDS:-1800}
SOAK_WARMUP=${SOAK_WARMUP:-120}
SOAK_MAX_GROWTH=${SOAK_MAX_GROWTH:-5}
SOAK_PURGE_EVERY=${SOAK_PURGE_EVERY:-5}
CLIENTS=8
# The sessions must outlive the last memory sample, so pgbench runs this much longer; the
# throughput table stops at SOAK_SECONDS.
TAIL_SECONDS=15
# Each sample is the smallest of these many readings a second apart: a reading taken in the
# middle of a transaction counts that transaction's contexts, which come and go.
READINGS=3
DB=idem_soak

for v in SOAK_SECONDS SOAK_WARMUP SOAK_PURGE_EVERY; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "soak: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[[ $SOAK_MAX_GROWTH =~ ^-?[0-9]+(\.[0-9]+)?$ ]] ||
  { echo "soak: SOAK_MAX_GROWTH must be a number, got '$SOAK_MAX_GROWTH'" >&2; exit 2; }
[ "$SOAK_WARMUP" -lt "$SOAK_SECONDS" ] ||
  { echo "soak: SOAK_WARMUP ($SOAK_WARMUP) must be shorter than SOAK_SECONDS ($SOAK_SECONDS)" >&2; exit 2; }
if [ -z "${SOAK_LOG:-}" ]; then
  SOAK_LOG=$(pg_lsclusters --no-header "${PGVERSION:?not in pg_virtualenv: set SOAK_LOG}" regress | awk '{print $7}')
fi
[ -r "$SOAK_LOG" ] || { echo "soak: cannot read the server log '$SOAK_LOG'" >&2; exit 2; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=$(mktemp -d)
purge_pid='' pgbench_pid=''
cleanup() {
  for p in $purge_pid $pgbench_pid; do kill "$p" 2>/dev/null || true; done
  # make test's later suites share the cluster; the tables' growth is no business of theirs.
  psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

psql_db() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }

# --- database: bench/run.sh's schema, with retentions short enough that every purge finds
# expired claims and sent messages to delete.
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "SET client_min_messages = warning" \
  -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
psql_db -c "CREATE EXTENSION idempotency"
psql_db -c "ALTER DATABASE $DB SET idempotency.default_retention = '10s'" \
  -c "ALTER DATABASE $DB SET idempotency.outbox_retention = '10s'"
psql_db -f "$HERE/setup.sql"
psql_db -f "$HERE/reset.sql"

SCRIPTS=(claim_ext.sql vupdate_ext.sql send_ext.sql relay_take_sent.sql)
WEIGHTS=(4 4 2 1)
args=()
for i in "${!SCRIPTS[@]}"; do args+=(-f "$HERE/${SCRIPTS[i]}@${WEIGHTS[i]}"); done

echo "== soak: $CLIENTS connections, ${SOAK_SECONDS}s, memory after ${SOAK_WARMUP}s and at the end, at most ${SOAK_MAX_GROWTH}% growth"
echo "scripts (weight): $(for i in "${!SCRIPTS[@]}"; do printf '%s (%s) ' "${SCRIPTS[i]}" "${WEIGHTS[i]}"; done)"
echo "purge: CALL idem_purge() every ${SOAK_PURGE_EVERY}s in one session; server log: $SOAK_LOG"
echo "server: $(psql_db -A -t -c 'SHOW server_version'), machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

start=$(date +%s)
echo "CALL idem_purge() \\watch $SOAK_PURGE_EVERY" |
  PGAPPNAME=soak_purge psql -X -A -t -v ON_ERROR_STOP=1 -d "$DB" >"$WORK/purge.out" 2>&1 &
purge_pid=$!
pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -T $((SOAK_SECONDS + TAIL_SECONDS)) -P 60 \
  -l --log-prefix="$WORK/tx" "${args[@]}" "$DB" >"$WORK/pgbench.out" 2>&1 &
pgbench_pid=$!

# The backends under load: pgbench's and the purge's.
backends() {
  psql_db -A -t -c "SELECT pid FROM pg_stat_activity WHERE datname = '$DB'
                     AND application_name IN ('pgbench', 'soak_purge') ORDER BY application_name, pid"
}

# Asks every backend to log its memory contexts and prints "PID BYTES" from the log lines
# "[PID] LOG:  Grand total: BYTES bytes" written after the request.
memory_totals() {  # memory_totals PID...
  local from waited=0 found
  from=$(($(stat -c %s "$SOAK_LOG") + 1))
  psql_db -A -t -o /dev/null -c "SELECT pg_log_backend_memory_contexts(pid) FROM unnest('{$(IFS=,; echo "$*")}'::int[]) AS pid"
  while :; do
    found=$(tail -c +"$from" "$SOAK_LOG" | sed -nE 's/.*\[([0-9]+)\].*Grand total: ([0-9]+) bytes.*/\1 \2/p' | sort -u -k1,1)
    [ "$(printf '%s' "$found" | grep -c .)" -lt $# ] || break
    if [ $((waited += 1)) -gt 30 ]; then
      echo "soak: no \"Grand total\" in $SOAK_LOG within 30 s for every backend of: $*; found: $found" >&2
      return 1
    fi
    sleep 1
  done
  printf '%s\n' "$found"
}

# Writes FILE: "PID BYTES PSS_KB ANON_KB" per backend, BYTES the smallest of READINGS.
sample() {  # sample FILE
  local pids r
  mapfile -t pids < <(backends)
  psql_db -A -t -c "SELECT pid FROM pg_stat_activity WHERE datname = '$DB' AND application_name = 'soak_purge'" >"$WORK/purge.pid"
  [ "${#pids[@]}" -eq $((CLIENTS + 1)) ] ||
    { echo "soak: expected $((CLIENTS + 1)) backends, found ${#pids[@]}: ${pids[*]}" >&2
      cat "$WORK/pgbench.out" "$WORK/purge.out" >&2; return 1; }
  for ((r = 1; r <= READINGS; r++)); do memory_totals "${pids[@]}"; sleep 1; done |
    awk '!($1 in min) || $2 < min[$1] { min[$1] = $2 } END { for (p in min) print p, min[p] }' | sort |
    while read -r pid bytes; do
      echo "$pid $bytes $(awk '/^Pss:/ { p = $2 } /^Anonymous:/ { a = $2 } END { print p, a }' "/proc/$pid/smaps_rollup")"
    done >"$1"
}

sleep_until() { local left=$(($1 - ($(date +%s) - start))); [ "$left" -le 0 ] || sleep "$left"; }
sleep_until "$SOAK_WARMUP"
sample "$WORK/warm"
sleep_until "$SOAK_SECONDS"
sample "$WORK/end"

status=0 fail=0
wait "$pgbench_pid" || status=$?
pgbench_pid=''
purge_alive=yes
kill "$purge_pid" 2>/dev/null || purge_alive=no
wait "$purge_pid" || true
purge_pid=''

echo
echo "-- pgbench progress (every 60 s, all operations) --"
grep '^progress:' "$WORK/pgbench.out" || true

# Log lines: client_id transaction_no latency_us|failed script_no time_epoch time_us
echo
echo "-- throughput per minute (tps; a transaction counts in the minute it ended) --"
cat "$WORK"/tx.* | awk -v start="$start" -v secs="$SOAK_SECONDS" -v names="${SCRIPTS[*]}" '
  BEGIN { n = split(names, name, " "); minutes = int((secs + 59) / 60) }
  { t = $5 - start; if (t < 0 || t >= secs) next
    m = int(t / 60); if ($3 == "failed") failed++; else { c[m, $4]++; all[m]++ } }
  END {
    printf "%-7s", "minute"; for (i = 1; i <= n; i++) printf " %20s", name[i]; printf " %10s\n", "all"
    for (m = 0; m < minutes; m++) {
      len = (m + 1) * 60 > secs ? secs - m * 60 : 60
      printf "%-7d", m + 1; for (i = 1; i <= n; i++) printf " %20.1f", c[m, i - 1] / len; printf " %10.1f\n", all[m] / len
    }
    printf "failed transactions: %d\n", failed
  }' | tee "$WORK/throughput"

echo
echo "-- memory per backend: memory contexts' grand total (judged), Pss and Anonymous of smaps_rollup (kB) --"
join "$WORK/warm" "$WORK/end" | awk -v max="$SOAK_MAX_GROWTH" -v purge="$(cat "$WORK/purge.pid")" '
  BEGIN { printf "%-16s %14s %14s %8s %10s %10s %10s %10s\n", "pid", "ctx warm B", "ctx end B", "growth", "Pss warm", "Pss end", "Anon warm", "Anon end" }
  { growth = ($5 - $2) * 100 / $2; over = growth > max
    printf "%-16s %14d %14d %7.2f%% %10d %10d %10d %10d%s\n", $1 ($1 == purge ? " purge" : " pgbench"), $2, $5, growth, $3, $6, $4, $7, over ? "   <-- over " max "%" : ""
    bad += over }
  END { exit bad > 0 }' || { echo "soak: FAIL: a backend's memory contexts grew by more than $SOAK_MAX_GROWTH% after the warm-up"; fail=1; }
[ "$(wc -l <"$WORK/warm")" = "$(join "$WORK/warm" "$WORK/end" | wc -l)" ] ||
  { echo "soak: FAIL: the backends at the end are not those after the warm-up"; fail=1; }

echo
purged=$(grep -E '^[0-9]+$' "$WORK/purge.out" | awk '{ s += $1; n++ } END { printf "%d purges deleted %d rows", n, s }')
echo "purge: $purged"
if [ "$purge_alive" = no ] || grep -q -E 'ERROR|FATAL' "$WORK/purge.out"; then
  echo "soak: FAIL: the purge session stopped or failed:"; cat "$WORK/purge.out"; fail=1
fi
failed=$(sed -nE 's/^failed transactions: ([0-9]+)$/\1/p' "$WORK/throughput")
if [ "$status" != 0 ] || [ "$failed" != 0 ] || grep -q -E 'ERROR|aborted' "$WORK/pgbench.out"; then
  echo "soak: FAIL: pgbench exited with status $status or reported errors:"; grep -v '^progress:' "$WORK/pgbench.out"
  fail=1
fi
[ "$fail" = 0 ] || exit 1
echo "soak: PASS"
