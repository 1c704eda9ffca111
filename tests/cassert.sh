#!/usr/bin/env bash
# `make test-cassert`: the server-side suites of tests/run-in-cluster.sh against an
# assert-enabled PostgreSQL 15 (tools/cassert-build.sh), where misuse of buffer, snapshot,
# memory-context and executor APIs that a release build forgives stops the backend with
# TRAP. The extension is built against that server's own headers, with its own pgrx
# configuration and target directory, so the release build and the system's install are
# never touched. REGRESS_TESTS and ISOLATION_TESTS: test names, as for `make regress`.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${CASSERT_PREFIX:-/var/cache/idempotency/pg15-cassert}
PG_CONFIG=$PREFIX/bin/pg_config
export PGRX_HOME=${CASSERT_PGRX_HOME:-/var/cache/idempotency/pgrx-cassert}
export CARGO_TARGET_DIR=${CASSERT_TARGET_DIR:-$PWD/target/cassert}
RUN=${CASSERT_RUN:-/tmp/idempotency-cassert}   # data directory, socket and server log
PORT=${CASSERT_PORT:-5499}

timings=""
phase() {  # phase NAME COMMAND...: runs COMMAND and notes how long it took
  local name=$1 start=$SECONDS rc=0; shift
  "$@" || rc=$?
  timings+="$name $((SECONDS - start))s, "
  return $rc
}

# --- 1. the assert-enabled server, built once per machine ------------------------------
phase build bash tools/cassert-build.sh

# --- 2. the extension, built against it ------------------------------------------------
# Its modules must land in the prefix: a pg_config that still answered the system's
# pkglibdir (as builds with Debian's patches did) would overwrite the system's extension.
for dir in pkglibdir sharedir; do
  [[ $("$PG_CONFIG" --$dir) == "$PREFIX"/* ]] ||
    { echo "cassert: $PG_CONFIG --$dir is $("$PG_CONFIG" --$dir), outside $PREFIX; rebuild it"; exit 1; }
done
install_extension() {
  # pgrx reads its configuration from $PGRX_HOME; `cargo pgrx install --pg-config` hands
  # that pg_config to pgrx-pg-sys, which generates the bindings from its headers.
  if ! grep -qs "^pg15 = \"$PG_CONFIG\"" "$PGRX_HOME/config.toml"; then
    cargo pgrx init --pg15 "$PG_CONFIG" || return
  fi
  cargo pgrx install --release --pg-config "$PG_CONFIG"
}
phase install install_extension

# --- 3. a throwaway cluster (PostgreSQL refuses to run as root) -------------------------
while ss -ltnH | grep -q ":$PORT\b" || [ -e "$RUN/.s.PGSQL.$PORT" ]; do PORT=$((PORT + 1)); done
as_postgres() { runuser -u postgres -- "$@"; }
LOG=$CARGO_TARGET_DIR/server.log
stop_cluster() {
  as_postgres "$PREFIX/bin/pg_ctl" -D "$RUN/data" -m fast stop >/dev/null 2>&1 || true
  cp "$RUN/server.log" "$LOG" 2>/dev/null || true
  rm -rf "$RUN"
}
start_cluster() {
  rm -rf "$RUN"; mkdir -p "$RUN" "$CARGO_TARGET_DIR"; chown postgres: "$RUN"
  as_postgres "$PREFIX/bin/initdb" -D "$RUN/data" -U postgres --auth=trust --encoding=UTF8 \
    --locale=C.UTF-8 --no-sync >/dev/null || return
  # pg_stat_statements too: tests/executor_hooks.sh needs it preloaded. No pg_cron here.
  as_postgres "$PREFIX/bin/pg_ctl" -D "$RUN/data" -l "$RUN/server.log" -w -o \
    "-p $PORT -k $RUN -c listen_addresses='' -c shared_preload_libraries=pgaudit,pg_stat_statements" start >/dev/null
}
trap stop_cluster EXIT
phase cluster start_cluster
echo "cassert: server $("$PREFIX/bin/postgres" -V) with assertions on, socket $RUN, port $PORT"

# --- 4. the suites (idempotency.direct_writes on, then off, as in `make regress`) ------
suites() {
  PATH=$PREFIX/bin:$PATH PGHOST=$RUN PGPORT=$PORT PGUSER=postgres \
    PGXS_TEST="$("$PG_CONFIG" --pkglibdir)/pgxs/src/test" RESULTS_DIR=$CARGO_TARGET_DIR \
    SKIP_SUITES="pg_cron" bash tests/run-in-cluster.sh | tee "$CARGO_TARGET_DIR/suites.out"
}
status=0
phase suites suites || status=$?

# --- 5. what the suites cannot see: a failed assertion kills one backend and the
# postmaster restarts, so a client may only notice a lost connection, or nothing at all.
traps=$(grep -E 'TRAP:|server process .* was terminated by signal' "$RUN/server.log" || true)
echo "== server log (last 30 lines of $LOG)"
tail -n 30 "$RUN/server.log"
if [ -n "$traps" ]; then
  echo "cassert: the server log shows failed assertions or crashed backends:"
  grep -E -B2 -A25 'TRAP:|server process .* was terminated by signal' "$RUN/server.log" | head -200
  status=1
fi
echo "cassert: timings: ${timings%, }"
if [ "$status" != 0 ]; then
  echo "cassert: FAILED (see above; the full server log is kept in $LOG)"
  exit 1
fi
passed=$(sed -n 's/^suites: \([0-9]*\) passed.*/\1/p' "$CARGO_TARGET_DIR/suites.out")
echo "cassert: $((passed + 1)) passed, 0 failed (the suites and a server log free of TRAP; pg_cron skipped)"
