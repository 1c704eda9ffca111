#!/usr/bin/env bash
# Runs every test that needs a server, inside the throwaway cluster that `make test` opens
# with pg_virtualenv (PGHOST, PGPORT, PGUSER and PGPASSWORD point at it).
# PGXS_TEST: PostgreSQL's pgxs test directory; REGRESS_TESTS and ISOLATION_TESTS: test names.
set -euo pipefail
cd "$(dirname "$0")/.."

show_diffs() { cat "$1/regression.diffs" 2>/dev/null | head -300; exit 1; }

echo "== pg_regress: pg_test/sql -> pg_test/expected"
mkdir -p target/regress target/regress-statements target/isolation target/isolation-statements
"$PGXS_TEST/regress/pg_regress" --inputdir=pg_test --outputdir=target/regress \
  --dbname=idempotency_regress $REGRESS_TESTS || show_diffs target/regress

# The same stories with every write through its SPI statement must give the same output:
# direct writes are an optimisation, never a change of behaviour.
echo "== pg_regress again with idempotency.direct_writes = off"
PGOPTIONS="-c idempotency.direct_writes=off" "$PGXS_TEST/regress/pg_regress" --inputdir=pg_test \
  --outputdir=target/regress-statements --dbname=idempotency_regress $REGRESS_TESTS || show_diffs target/regress-statements

echo "== isolation: concurrent sessions, pg_test/isolation/specs -> expected"
"$PGXS_TEST/isolation/pg_isolation_regress" --inputdir=pg_test/isolation \
  --outputdir=target/isolation --dbname=idempotency_isolation $ISOLATION_TESTS || show_diffs target/isolation
echo "== isolation again with idempotency.direct_writes = off"
PGOPTIONS="-c idempotency.direct_writes=off" "$PGXS_TEST/isolation/pg_isolation_regress" --inputdir=pg_test/isolation \
  --outputdir=target/isolation-statements --dbname=idempotency_isolation $ISOLATION_TESTS || show_diffs target/isolation-statements

echo "== client-driven tests (several real connections)"
cargo test -p idempotency-client-tests -- --test-threads=1

echo "== pg_dump and restore keep every processed key"
bash tests/dump_restore.sh

echo "== pg_cron runs the scheduled purge"
bash tests/pg_cron.sh

# Every suite above stops the script on its first failure, so reaching here means all passed.
echo "suites: 7 passed, 0 failed"
