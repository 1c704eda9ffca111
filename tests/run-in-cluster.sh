#!/usr/bin/env bash
# Runs every test that needs a server, inside the throwaway cluster that `make test` opens
# with pg_virtualenv (PGHOST, PGPORT, PGUSER and PGPASSWORD point at it).
# PGXS_TEST: PostgreSQL's pgxs test directory; REGRESS_TESTS and ISOLATION_TESTS: test names.
set -euo pipefail
cd "$(dirname "$0")/.."

show_diffs() { cat "$1/regression.diffs" 2>/dev/null | head -300; exit 1; }

# Each suite runs twice against the same expected output: as is, and with every write
# through its SPI statement. Direct writes are an optimisation, never a change of behaviour.
both_ways() {  # both_ways TITLE OUTDIR COMMAND...
  local title=$1 out=$2; shift 2
  echo "== $title"
  mkdir -p "$out" "$out-statements"
  "$@" --outputdir="$out" || show_diffs "$out"
  echo "== $title, again with idempotency.direct_writes = off"
  PGOPTIONS="-c idempotency.direct_writes=off" "$@" --outputdir="$out-statements" || show_diffs "$out-statements"
}

both_ways "pg_regress: pg_test/sql -> pg_test/expected" target/regress \
  "$PGXS_TEST/regress/pg_regress" --inputdir=pg_test --dbname=idempotency_regress $REGRESS_TESTS
both_ways "isolation: concurrent sessions, pg_test/isolation/specs -> expected" target/isolation \
  "$PGXS_TEST/isolation/pg_isolation_regress" --inputdir=pg_test/isolation --dbname=idempotency_isolation $ISOLATION_TESTS

echo "== client-driven tests (several real connections)"
cargo test -p idempotency-client-tests -- --test-threads=1

# Direct writes, statement writes and hand-written SQL on random shapes; the two known-open
# coercion-timing classes are reported without failing (tests/differential/src/main.rs).
echo "== differential tester (short)"
cargo run -q --release -p idempotency-differential -- --seed 1 --cases 200 --allow lazy-coercion --allow domain-coercion

echo "== pg_dump and restore keep every processed key"
bash tests/dump_restore.sh

echo "== pg_cron runs the scheduled purge"
bash tests/pg_cron.sh

echo "== what pgaudit, pg_stat_statements and auto_explain see of direct writes"
bash tests/executor_hooks.sh

# Every suite above stops the script on its first failure, so reaching here means all passed.
echo "suites: 9 passed, 0 failed"
