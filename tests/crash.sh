#!/usr/bin/env bash
# Crashes (#15): tests/client/tests/crash.rs kills a backend with SIGKILL between its claim and
# its COMMIT, then stops the whole server with `pg_ctl stop -m immediate` in the middle of a
# storm of consumers, and checks after each crash recovery that exactly what committed is
# there and that redelivery processes every message once. Both crash the server they run on,
# so this script gives them a cluster of its own (initdb and pg_ctl as postgres, which
# PostgreSQL requires), removed at the end whatever happens, and then reads its log for leaks
# and crashes other than the one it provoked (tests/leak_sentinel.sh).
#   PG_BINDIR    the server's binaries (default the system's 15); the extension and amcheck
#                must be installed for that server
#   CRASH_PORT   the cluster's port (default 5471). It listens only on a socket in its own
#                directory, so the port cannot collide with another server's.
#   RESULTS_DIR  where the server log is kept for a look afterwards (default target/)
# Run as root; `make test` runs it among tests/run-in-cluster.sh's suites.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_BINDIR=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
PORT=${CRASH_PORT:-5471}
RESULTS_DIR=${RESULTS_DIR:-target}
MAJOR=$("$PG_BINDIR/postgres" -V | sed -E 's/^postgres \(PostgreSQL\) ([0-9]+).*/\1/')
started=$SECONDS

# A directory of its own, so that runs at once (make test beside a developer's run) cannot meet.
RUN=$(mktemp -d /tmp/idempotency-crash.XXXXXX)
DATA=$RUN/data LOG=$RUN/server.log
as_postgres() { runuser -u postgres -- "$@"; }
cleanup() {
  as_postgres "$PG_BINDIR/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
  mkdir -p "$RESULTS_DIR" && cp "$LOG" "$RESULTS_DIR/crash-server.log" 2>/dev/null || true
  rm -rf "$RUN"
}
trap cleanup EXIT
chown postgres: "$RUN"

as_postgres "$PG_BINDIR/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 \
  --no-sync >/dev/null
# In postgresql.conf rather than on pg_ctl's command line: crash.rs starts the server again
# after its immediate stop, and must get the same settings. Durability is what is tested, so
# every setting that could weaken it is spelled out, as is the restart the SIGKILL relies on.
cat >>"$DATA/postgresql.conf" <<EOF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$RUN'
fsync = on
synchronous_commit = on
full_page_writes = on
restart_after_crash = on
EOF
as_postgres "$PG_BINDIR/pg_ctl" -D "$DATA" -l "$LOG" -w start >/dev/null
echo "crash: $("$PG_BINDIR/postgres" -V), cluster $DATA, socket $RUN, port $PORT"

# The client tests' libpq variables, which pg_virtualenv points at its own cluster.
export PGHOST=$RUN PGPORT=$PORT PGUSER=postgres PGDATABASE=postgres
unset PGPASSWORD PGOPTIONS
export CRASH_STOP="runuser -u postgres -- $PG_BINDIR/pg_ctl -D $DATA -m immediate stop"
export CRASH_START="runuser -u postgres -- $PG_BINDIR/pg_ctl -D $DATA -l $LOG -w start"
export CRASH_KILLED_PID=$RUN/killed.pid
cargo test -q -p idempotency-client-tests --test crash --no-run
# Each test in a process of its own, for a fresh database each. The timeout is a safety net
# for a server that never comes back: each run takes seconds.
for test in sigkill_between_claim_and_commit_leaves_nothing immediate_stop_during_a_storm_keeps_exactly_what_committed; do
  timeout --kill-after=10 180 cargo test -q -p idempotency-client-tests --test crash -- --ignored --exact "$test" \
    --nocapture
done

# The SIGKILL makes the postmaster log the backend's death and the restart of all the others,
# which the sentinel counts as a crash: exactly those two lines, each once, are let through;
# any other crash, assertion or leak fails. (An immediate stop logs neither.)
killed=$(cat "$CRASH_KILLED_PID")
provoked=("(PID $killed) was terminated by signal 9: Killed"
          "LOG:  terminating any other active server processes")
for line in "${provoked[@]}"; do
  n=$(grep -c -F -e "$line" "$LOG" || true)
  [ "$n" = 1 ] || { echo "crash: the server log shows \"$line\" $n times, not once"; exit 1; }
done
grep -v -F -e "${provoked[0]}" -e "${provoked[1]}" "$LOG" >"$RUN/unprovoked.log"
bash tests/leak_sentinel.sh "$RUN/unprovoked.log" "$MAJOR"
echo "crash: passed in $((SECONDS - started)) s"
