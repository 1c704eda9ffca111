#!/usr/bin/env bash
# The server-side suites of tests/run-in-cluster.sh against a PostgreSQL of our own
# (tools/pg-build.sh BUILD, built once per machine), started with initdb and pg_ctl:
#   tests/own-server.sh 15-cassert   `make test-cassert`: assertions on, so misuse of buffer,
#                                    snapshot, memory-context and executor APIs that a release
#                                    build forgives stops the backend with TRAP.
#   tests/own-server.sh 18-cassert   `make test-cassert CASSERT_MAJOR=18`: the same on 18.
#   tests/own-server.sh 18           `make test-pg18`: the newest major, which Debian 12 does
#                                    not package.
#   tests/own-server.sh 18 CMD...    CMD in place of the suites, with PGHOST, PGPORT, PGUSER
#                                    and PATH set as pg_virtualenv sets them (`make bench
#                                    PG_MAJOR=18`); SERVER_OPTIONS: more `-c name=value`.
# The extension is built against that server's own headers, with its own target directory,
# so the system's install is never touched. REGRESS_TESTS and ISOLATION_TESTS: test names,
# as for `make regress`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:?usage: tests/own-server.sh 15-cassert|18|18-cassert [CMD...]}
shift
PREFIX=$(bash tools/pg-build.sh --prefix "$BUILD")
PG_CONFIG=$PREFIX/bin/pg_config
case $BUILD in
  # Its pgrx configuration is apart: its `pg15` must not replace the system's 15 in ~/.pgrx.
  15-cassert) export PGRX_HOME=${CASSERT_PGRX_HOME:-/var/cache/idempotency/pgrx-cassert}
              export CARGO_TARGET_DIR=${CASSERT_TARGET_DIR:-$PWD/target/cassert}
              RUN=${CASSERT_RUN:-/tmp/idempotency-cassert} PORT=${CASSERT_PORT:-5499} ;;
  # The assert-enabled builds share that configuration, apart from ~/.pgrx's release 18.
  18-cassert) export PGRX_HOME=${CASSERT_PGRX_HOME:-/var/cache/idempotency/pgrx-cassert}
              export CARGO_TARGET_DIR=${CASSERT_TARGET_DIR:-$PWD/target/cassert18}
              RUN=${CASSERT_RUN:-/tmp/idempotency-cassert18} PORT=${CASSERT_PORT:-5520} ;;
  # `make pgrx-init` registers this one in ~/.pgrx beside the system's 15.
  18)         export CARGO_TARGET_DIR=${PG18_TARGET_DIR:-$PWD/target/pg18}
              RUN=${PG18_RUN:-/tmp/idempotency-pg18} PORT=${PG18_PORT:-5518} ;;
esac
# RUN: data directory, socket and server log.
# The suites' own programs (client tests, relay, differential tester) are clients, the same
# whatever the server: they share the target directory of `make test`'s run on the system's
# 15 rather than being compiled again for each build.
CLIENT_TARGET_DIR=${CLIENT_TARGET_DIR:-$PWD/target}

timings=""
phase() {  # phase NAME COMMAND...: runs COMMAND and notes how long it took
  local name=$1 start=$SECONDS rc=0; shift
  "$@" || rc=$?
  timings+="$name $((SECONDS - start))s, "
  return $rc
}

# --- 1. the server, built once per machine ---------------------------------------------
phase build bash tools/pg-build.sh "$BUILD"
MAJOR=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')

# --- 2. the extension, built against it ------------------------------------------------
# Its modules must land in the prefix: a pg_config that still answered the system's
# pkglibdir (as builds with Debian's patches did) would overwrite the system's extension.
for dir in pkglibdir sharedir; do
  [[ $("$PG_CONFIG" --$dir) == "$PREFIX"/* ]] ||
    { echo "$BUILD: $PG_CONFIG --$dir is $("$PG_CONFIG" --$dir), outside $PREFIX; rebuild it"; exit 1; }
done
install_extension() {
  # pgrx reads its configuration from $PGRX_HOME; `cargo pgrx install --pg-config` hands
  # that pg_config to pgrx-pg-sys, which generates the bindings from its headers, and picks
  # the crate's pgNN feature from its version.
  if ! grep -qs "^pg$MAJOR = \"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    cargo pgrx init "--pg$MAJOR" "$PG_CONFIG" || return
  fi
  bash tools/pgrx-install.sh "$PG_CONFIG"
}
phase install install_extension

# --- 3. a throwaway cluster (PostgreSQL refuses to run as root) -------------------------
while ss -ltnH | grep -q ":$PORT\b" || [ -e "$RUN/.s.PGSQL.$PORT" ]; do PORT=$((PORT + 1)); done
as_postgres() { runuser -u postgres -- "$@"; }
LOG=$CARGO_TARGET_DIR/server.log
preload=pgaudit,pg_stat_statements skip="" skip_why="" cron_settings=""
if bash tools/pg-build.sh --has-cron "$BUILD"; then
  preload+=,pg_cron cron_settings="-c cron.database_name=postgres -c cron.use_background_workers=on"
else
  skip=pg_cron skip_why="pg_cron: $BUILD has no pg_cron"$'\n'
  echo "$BUILD: pg_cron suite skipped: this build has no pg_cron (its sources could not be fetched when it was built)"
fi
# Nobody benchmarks an assert-enabled server: its bench smokes would only repeat, slowly, what
# the release builds' runs check of the bench scripts (CI's 60 minutes).
if [[ $BUILD == *-cassert ]]; then
  for smoke in bench_smoke bench_scale_smoke; do
    skip+=" $smoke" skip_why+="$smoke: benchmarks run on release builds"$'\n'
  done
fi
stop_cluster() {
  as_postgres "$PREFIX/bin/pg_ctl" -D "$RUN/data" -m fast stop >/dev/null 2>&1 || true
  cp "$RUN/server.log" "$LOG" 2>/dev/null || true
  rm -rf "$RUN"
}
start_cluster() {
  rm -rf "$RUN"; mkdir -p "$RUN" "$CARGO_TARGET_DIR"; chown postgres: "$RUN"
  as_postgres "$PREFIX/bin/initdb" -D "$RUN/data" -U postgres --auth=trust --encoding=UTF8 \
    --locale=C.UTF-8 --no-sync >/dev/null || return
  # pg_stat_statements too: tests/executor_hooks.sh needs it preloaded. TCP to localhost as well as
  # the socket: JDBC (the Java consumer in tests/readme_snippets.sh) cannot reach a Unix socket.
  as_postgres "$PREFIX/bin/pg_ctl" -D "$RUN/data" -l "$RUN/server.log" -w -o \
    "-p $PORT -k $RUN -c listen_addresses=localhost -c shared_preload_libraries=$preload $cron_settings ${SERVER_OPTIONS:-}" start >/dev/null
}
trap stop_cluster EXIT
phase cluster start_cluster
echo "$BUILD: server $("$PREFIX/bin/postgres" -V) ($("$PG_CONFIG" --configure | grep -q enable-cassert && echo "assertions on" || echo "release build")), socket $RUN, port $PORT"

in_cluster() {
  PATH=$PREFIX/bin:$PATH PGHOST=$RUN PGPORT=$PORT PGUSER=postgres "$@"
}
if [ $# -gt 0 ]; then
  in_cluster "$@"
  exit
fi

# --- 4. the suites (idempotency.direct_writes on, then off, as in `make regress`) ------
# The README's consumers run whole on the system's 15; here one per driver family is enough, as
# what they add over 15's run is the server, not the client code (CI's 60 minutes).
suites() {
  in_cluster env PGXS_TEST="$("$PG_CONFIG" --pkglibdir)/pgxs/src/test" RESULTS_DIR=$CARGO_TARGET_DIR \
    CARGO_TARGET_DIR="$CLIENT_TARGET_DIR" \
    SKIP_SUITES="$skip" SKIP_WHY="$skip_why" SERVER_LOG="" PG_BINDIR="$PREFIX/bin" \
    LANGS="${LANGS:-python node go java}" bash tests/run-in-cluster.sh |
    tee "$CARGO_TARGET_DIR/suites.out"
}
status=0
phase suites suites || status=$?

# --- 5. what the suites cannot see: a failed assertion kills one backend and the
# postmaster restarts, so a client may only notice a lost connection, or nothing at all; a
# leaked buffer pin, relcache reference or snapshot is only a WARNING in the log.
echo "== server log (last 30 lines of $LOG)"
tail -n 30 "$RUN/server.log"
bash tests/leak_sentinel.sh "$RUN/server.log" "$MAJOR" || status=1
echo "$BUILD: timings: ${timings%, }"
if [ "$status" != 0 ]; then
  bash tests/last-words.sh "$CARGO_TARGET_DIR/suites.out" || true
  echo "$BUILD: FAILED (see above; the full server log is kept in $LOG)"
  exit 1
fi
passed=$(sed -n 's/^suites: \([0-9]*\) passed.*/\1/p' "$CARGO_TARGET_DIR/suites.out")
echo "$BUILD: $((passed + 1)) passed, 0 failed (the suites and a server log free of leaks and crashed backends${skip:+; $skip skipped})"
