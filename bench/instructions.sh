#!/usr/bin/env bash
# Instructions per transaction of a pgbench script, counted by callgrind in the backend that
# serves it: unlike tps, the count is the same from run to run whatever else the machine does.
#
# Run by `make bench-instructions` (as root or as the postgres user). For each script named
# (default: the versioned-update pair), a throwaway cluster runs under valgrind; one pgbench
# client runs N and then 3N transactions, and the difference over 2N is what one transaction
# costs, connection start-up and warm-up excluded.
#
#   INSTRUCTIONS_TRANSACTIONS  N (default 1000)
#   INSTRUCTIONS_PROFILE       a directory: keeps there each script's callgrind profile of the
#                              3N run's backend, for callgrind_annotate (<script>.callgrind)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
N=${INSTRUCTIONS_TRANSACTIONS:-1000}
SCRIPTS=("$@")
[ ${#SCRIPTS[@]} -gt 0 ] || SCRIPTS=(vupdate_hand.sql vupdate_ext.sql)

WORK=$(mktemp -d /tmp/idempotency-instructions.XXXXXX)
trap 'as_postgres "$BIN/pg_ctl" -D "$WORK/data" stop -m immediate >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
if [ "$(id -u)" = 0 ]; then
  chown postgres "$WORK"
  as_postgres() { runuser -u postgres -- "$@"; }
else
  as_postgres() { "$@"; }
fi
PORT=5499
export PGHOST=$WORK PGPORT=$PORT PGUSER=postgres PGDATABASE=bench

as_postgres "$BIN/initdb" -D "$WORK/data" -A trust -U postgres >/dev/null
cat >>"$WORK/data/postgresql.conf" <<CONF
port = $PORT
unix_socket_directories = '$WORK'
listen_addresses = ''
synchronous_commit = off
autovacuum = off
CONF

start() {  # start [valgrind...]: the cluster, under the given wrapper
  as_postgres "$@" "$BIN/postgres" -D "$WORK/data" >"$WORK/server.log" 2>&1 &
  for _ in $(seq 120); do psql -X -d postgres -Atc 'SELECT 1' >/dev/null 2>&1 && return; sleep 1; done
  echo "instructions: the server did not start:" >&2; cat "$WORK/server.log" >&2; exit 1
}
stop() { as_postgres "$BIN/pg_ctl" -D "$WORK/data" stop -m fast >/dev/null; }
sql() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }

start
sql -d postgres -c "CREATE DATABASE bench"
sql -c "CREATE EXTENSION idempotency" -f "$HERE/setup.sql"
stop

count() {  # count SCRIPT TRANSACTIONS: instructions of the pgbench backend
  # A directory per count: valgrind may still be writing the last one's files after pg_ctl
  # has seen the server stop.
  local cg
  cg=$(mktemp -d "$WORK/cg.XXXXXX"); [ "$(id -u)" != 0 ] || chown postgres "$cg"
  start valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$cg/out.%p"
  sql -f "$HERE/reset.sql" >/dev/null
  pgbench -n -M prepared -c 1 -t "$2" -f "$HERE/$1" >/dev/null
  stop
  # The last backend forked is pgbench's.
  local profile
  profile=$cg/out.$(ls "$cg" | sed 's/^out\.//' | sort -n | tail -n1)
  [ -z "${INSTRUCTIONS_PROFILE:-}" ] || { mkdir -p "$INSTRUCTIONS_PROFILE"; cp "$profile" "$INSTRUCTIONS_PROFILE/$1.callgrind"; }
  grep -m1 '^summary:' "$profile" | cut -d' ' -f2
}

printf '%-24s %14s\n' script instructions/transaction
for script in "${SCRIPTS[@]}"; do
  low=$(count "$script" "$N")
  high=$(count "$script" $((3 * N)))
  printf '%-24s %14d\n' "$script" $(((high - low) / (2 * N)))
done
