#!/usr/bin/env bash
# Runs every test that needs a server, inside the throwaway cluster that `make test` opens
# with pg_virtualenv (PGHOST, PGPORT, PGUSER and PGPASSWORD point at it).
# PGXS_TEST: PostgreSQL's pgxs test directory; REGRESS_TESTS and ISOLATION_TESTS: test names.
# tests/own-server.sh runs the same suites against a self-built server, with five switches:
# SKIP_SUITES: names of suites to leave out (a build without pg_cron), SKIP_WHY: why, as lines
# "NAME: reason";
# RESULTS_DIR: where pg_regress writes its output (default target/); SERVER_LOG: the server
# log the last suite reads for leaks and crashes, by default that of pg_virtualenv's cluster,
# empty where the caller reads its own (own-server.sh does, also after a failed suite);
# PG_BINDIR: the build whose binaries tests/crash.sh starts its cluster with (default the
# system's 15).
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS_DIR=${RESULTS_DIR:-target}
if [ -z "${SERVER_LOG+set}" ]; then
  SERVER_LOG=$(pg_lsclusters --no-header "${PGVERSION:?not in pg_virtualenv: set SERVER_LOG}" regress |
    awk '{print $7}')
fi
passed=0 skipped=""

# The diffs, then the failing tests' names (15 prints "... FAILED", 16 on "not ok"), which
# the failure's repeated last lines then hold.
show_diffs() {
  head -300 "$1/regression.diffs" 2>/dev/null || true  # no diffs file: a crash, say; the names still follow
  echo "failed tests in $1: $(grep -E '\.\.\. FAILED|^not ok' "$1/regression.out" 2>/dev/null |
    sed -E 's/^(not ok +[0-9]+ +- +|test +| +)//; s/ +\.\.\. FAILED.*| +[0-9]+ ms.*//' | tr '\n' ' ')"
  exit 1
}

# A failure's last line names its suite: a CI log keeps only its tail.
failing=""
report_failure() {  # report_failure STATUS
  [ "$1" = 0 ] || [ -z "$failing" ] || echo "suites: FAILED in $failing, after $passed passed"
}
trap 'report_failure $?' EXIT

# suite NAME TITLE COMMAND...: runs COMMAND unless NAME is listed in SKIP_SUITES; any
# failure stops the script.
suite() {
  local name=$1 title=$2; shift 2
  if [[ " ${SKIP_SUITES:-} " == *" $name "* ]]; then
    local why
    why=$(printf '%s\n' "${SKIP_WHY:-}" | sed -n "s/^$name: //p")
    echo "== $title: skipped (${why:-SKIP_SUITES})"; skipped+=" $name"; return
  fi
  echo "== $title"
  failing="$name ($title)"
  local started=$SECONDS
  "$@"
  failing=""
  passed=$((passed + 1))
  # Each suite's time, so that a CI log shows where its budget goes.
  echo "-- $name: $((SECONDS - started)) s"
}

# Each suite runs twice against the same expected output: as is, and with every write
# through its SPI statement. Direct writes are an optimisation, never a change of behaviour.
regress_into() {  # regress_into OUTDIR COMMAND...
  local out=$1; shift
  mkdir -p "$out"
  "$@" --outputdir="$out" || show_diffs "$out"
}
both_ways() {  # both_ways NAME TITLE OUTDIR COMMAND...
  local name=$1 title=$2 out=$3; shift 3
  suite "$name" "$title" regress_into "$out" "$@"
  PGOPTIONS="-c idempotency.direct_writes=off" \
    suite "$name" "$title, again with idempotency.direct_writes = off" regress_into "$out-statements" "$@"
}

# The two suites' commands, also run by the upgraded pass below; the test lists split on purpose.
regress=("$PGXS_TEST/regress/pg_regress" --inputdir=pg_test --dbname=idempotency_regress $REGRESS_TESTS)
isolation=("$PGXS_TEST/isolation/pg_isolation_regress" --inputdir=pg_test/isolation --dbname=idempotency_isolation
           $ISOLATION_TESTS)
both_ways regress "pg_regress: pg_test/sql -> pg_test/expected" "$RESULTS_DIR/regress" "${regress[@]}"
both_ways isolation "isolation: concurrent sessions, pg_test/isolation/specs -> expected" "$RESULTS_DIR/isolation" \
  "${isolation[@]}"

suite client "client-driven tests (several real connections)" \
  cargo test -p idempotency-client-tests -- --test-threads=1
# On a cluster of its own, since it crashes its server twice; its log has its own sentinel.
suite crash "crash recovery: SIGKILL between claim and COMMIT, pg_ctl stop -m immediate in a storm" \
  bash tests/crash.sh
# A primary and a streaming standby of its own, stopped with -m immediate under the README's
# Python consumer and RabbitMQ, the standby promoted: sync loses nothing, async only lags.
suite failover "failover: synchronous and asynchronous standby promoted under a consumer (RabbitMQ)" \
  bash tests/failover.sh
# The outbox's relay program against the machine's RabbitMQ and NATS: 10,000 messages over 200
# keys with four relays, one killed mid-stream, and a broker outage through a proxy it cuts.
suite relay "idempotency-relay end to end (RabbitMQ, NATS JetStream)" \
  cargo test -p idempotency-relay -- --test-threads=1 --nocapture
# Direct writes, statement writes and hand-written SQL on random shapes; any difference fails.
suite differential "differential tester (short)" \
  cargo run -q --release -p idempotency-differential -- --seed 1 --cases 200
# make bench's scripts and its report, briefly; the relays are the debug build the relay suite made.
suite bench_smoke "make bench, short form (1 s rounds; figures not judged), and its report" bash tests/bench_smoke.sh
# make bench-scale's 1 M form: both key kinds, default checkpoints, one short window each.
suite bench_scale_smoke "make bench-scale, 1 M keys (figures not judged)" \
  env SCALE_SIZES=1000000 SCALE_SECONDS=2 SCALE_ROUNDS=1 SCALE_CHECKPOINTS=default SCALE_REPORT=/dev/null bash bench/scale.sh
# make soak's 2-minute form. It reads the server log for the backends' memory contexts, so
# it runs only where that log is ours to read (not under own-server.sh).
[ -z "$SERVER_LOG" ] || suite soak "soak, 2 minutes: no backend's memory contexts grow more than 5 % after a 45 s warm-up" \
  env SOAK_SECONDS=120 SOAK_WARMUP=45 SOAK_LOG="$SERVER_LOG" bash bench/soak.sh
suite dump_restore "pg_dump and restore keep every processed key" bash tests/dump_restore.sh
suite upgrade "ALTER EXTENSION UPDATE from every release keeps every stored key" bash tests/upgrade.sh

# The suites once more on databases whose CREATE EXTENSION installs the oldest release and
# updates it through the upgrade scripts, since the current version's script is set aside.
upgraded_pass() {
  UPGRADE_ONLY_PATH=1 bash tests/upgrade.sh
  trap 'status=$?; UPGRADE_RESTORE=1 bash tests/upgrade.sh; report_failure $status' EXIT
  regress_into "$RESULTS_DIR/regress-upgraded" "${regress[@]}"
  regress_into "$RESULTS_DIR/isolation-upgraded" "${isolation[@]}"
  cargo run -q --release -p idempotency-differential -- --seed 2 --cases 100
  UPGRADE_RESTORE=1 bash tests/upgrade.sh
  trap 'report_failure $?' EXIT
}
suite upgraded "pg_regress, isolation and the differential tester on an extension updated from the oldest release" upgraded_pass
suite pg_cron "pg_cron runs the scheduled purge" bash tests/pg_cron.sh
suite executor_hooks "what pgaudit, pg_stat_statements and auto_explain see of direct writes" \
  bash tests/executor_hooks.sh
# The external-call ledger against a fake API that counts charges and kills the consumer
# between a charge and its confirmation.
suite external_calls "external calls: a consumer killed after its call never calls again" \
  bash -c 'source tests/python-venv.sh && "$venv/bin/python" tests/external_calls.py'
suite readme_snippets "README's language snippets: equal to examples/, whose consumers survive SIGKILL (RabbitMQ)" \
  bash tests/readme_snippets.sh
# Last, so that it reads what every suite above made the server log. pg_virtualenv deletes the
# log with its cluster: the copy in $RESULTS_DIR stays for a look afterwards.
server_log() {
  cp "$SERVER_LOG" "$RESULTS_DIR/server.log"
  bash tests/leak_sentinel.sh "$RESULTS_DIR/server.log" "$PGVERSION"
}
[ -z "$SERVER_LOG" ] ||
  suite leak_sentinel "server log: no leaked resource, failed assertion or crashed process" server_log

# Every suite above stops the script on its first failure, so reaching here means all passed.
echo "suites: $passed passed, 0 failed${skipped:+ (skipped:$skipped)}"
