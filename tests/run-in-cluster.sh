#!/usr/bin/env bash
# Runs every test that needs a server, inside the throwaway cluster that `make test` opens
# with pg_virtualenv (PGHOST, PGPORT, PGUSER and PGPASSWORD point at it).
# PGXS_TEST: PostgreSQL's pgxs test directory; REGRESS_TESTS and ISOLATION_TESTS: test names.
set -euo pipefail
cd "$(dirname "$0")/.."

show_diffs() { cat "$1/regression.diffs" 2>/dev/null | head -300; exit 1; }

echo "== pg_regress: pg_test/sql -> pg_test/expected"
mkdir -p target/regress target/isolation
"$PGXS_TEST/regress/pg_regress" --inputdir=pg_test --outputdir=target/regress \
  --dbname=idempotency_regress $REGRESS_TESTS || show_diffs target/regress

echo "== isolation: concurrent sessions, pg_test/isolation/specs -> expected"
"$PGXS_TEST/isolation/pg_isolation_regress" --inputdir=pg_test/isolation \
  --outputdir=target/isolation --dbname=idempotency_isolation $ISOLATION_TESTS || show_diffs target/isolation

echo "== client-driven tests (several real connections)"
cargo test -p idempotency-client-tests -- --test-threads=1

echo "== pg_dump and restore keep every processed key"
bash tests/dump_restore.sh

echo "== pg_cron runs the scheduled purge"
bash tests/pg_cron.sh

# Every suite above stops the script on its first failure, so reaching here means all passed.
echo "suites: 5 passed, 0 failed"
