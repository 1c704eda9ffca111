#!/usr/bin/env bash
# What the executor's observers see of a direct write (the cluster preloads pgaudit and
# pg_stat_statements; see VIRTUALENV in the Makefile).
# - pgaudit logs a direct write as it logs the statement: its permission-check hook runs on
#   both paths, in session logging of WRITE and in object logging of the target.
# - pg_stat_statements with track = all, and auto_explain logging nested statements, hook
#   ExecutorStart, which a direct write never calls: there the statement path runs instead.
set -euo pipefail

fail() { echo "executor hooks: $*" >&2; exit 1; }
psql -qX -v ON_ERROR_STOP=1 -d postgres <<'SQL'
SET client_min_messages = warning;
DROP DATABASE IF EXISTS idem_hooks;
CREATE DATABASE idem_hooks;
SQL
run() { psql -qXAt -v ON_ERROR_STOP=1 -d idem_hooks "$@" 2>&1; }
run >/dev/null <<'SQL'
CREATE EXTENSION idempotency;
CREATE EXTENSION pg_stat_statements;
CREATE TABLE read_model (id int PRIMARY KEY, status text, version int);
INSERT INTO read_model VALUES (1, 'new', 1);
CREATE ROLE auditor NOLOGIN;
GRANT INSERT ON idempotency.ledger TO auditor;
GRANT UPDATE ON read_model TO auditor;
GRANT UPDATE ON idempotency.watermarks TO auditor;
INSERT INTO idempotency.watermarks (stream, partition, position) VALUES ('audited', '0', 0);
CREATE SEQUENCE audited_positions;
SQL

audited() {  # audited SETTING: the AUDIT lines of a claim, a versioned update and an advance
  run <<SQL | grep 'AUDIT:' || true
SET pgaudit.log_client = on;
SET pgaudit.log_level = notice;
$1
SELECT idem_claim('audited-' || pg_backend_pid());
SELECT idem_versioned_update('read_model', '{"id": 1}', ('{"status": "paid", "version": ' || pg_backend_pid() || '}')::jsonb);
SELECT idem_watermark_advance('audited', 0, nextval('audited_positions'));
SQL
}
expect_audit() {  # expect_audit LINES PATTERN...: each pattern appears in LINES
  local lines=$1; shift
  for pattern in "$@"; do
    grep -qE "AUDIT: $pattern" <<<"$lines" || fail "pgaudit did not log '$pattern'; it logged:
$lines"
  done
}
# Object logging: a direct write is logged with the statement that called it.
object=$(audited "SET pgaudit.role = 'auditor';")
expect_audit "$object" "OBJECT,1,[0-9]+,WRITE,INSERT,TABLE,idempotency.ledger,\"?SELECT idem_claim" \
                       "OBJECT,2,[0-9]+,WRITE,UPDATE,TABLE,public.read_model,\"?SELECT idem_versioned_update" \
                       "OBJECT,[34],[0-9]+,WRITE,UPDATE,TABLE,idempotency.watermarks,\"?SELECT idem_watermark_advance"
grep -q 'AUDIT: SESSION' <<<"$object" && fail "no session logging was asked for: $object"
# Session logging of WRITE: the statement path runs, so both classes of line appear.
session=$(audited "SET pgaudit.log = 'ddl, write'; SET pgaudit.role = 'auditor';")
expect_audit "$session" "SESSION,1,[0-9]+,WRITE,INSERT,,,\"?INSERT INTO idempotency.ledger" \
                        "OBJECT,1,[0-9]+,WRITE,INSERT,TABLE,idempotency.ledger," \
                        "SESSION,2,[0-9]+,WRITE,UPDATE,,,\"?UPDATE public.read_model" \
                        "OBJECT,2,[0-9]+,WRITE,UPDATE,TABLE,public.read_model," \
                        "SESSION,[34],[0-9]+,WRITE,UPDATE,,,\"?UPDATE idempotency.watermarks"
session_all=$(audited "SET pgaudit.log = 'all, -misc';")
expect_audit "$session_all" "SESSION,1,[0-9]+,WRITE,INSERT,,,\"?INSERT INTO idempotency.ledger"
echo "executor hooks: pgaudit logs direct writes (object) and, with session logging of WRITE, their statements"

# A keyed send checks its number with a read of the outbox, which a direct send makes itself
# while nothing watches reads: pgaudit logs that read alike with direct writes on and off.
# (Its write is logged with the statement that called it where it is direct, as above.)
read_lines() {  # read_lines SETTINGS DIRECT: a keyed send's AUDIT lines of reads, without their counters
  run <<SQL | grep 'AUDIT:.*,READ,' | sed -E 's/^.*AUDIT: (SESSION|OBJECT),[0-9]+,[0-9]+,/\1,/' || true
SET pgaudit.log_client = on;
SET pgaudit.log_level = notice;
SET idempotency.direct_writes = $2;
$1
SELECT idem_send('audited', '{"n": 1}', ordering_key => 'audited-key', key => 'audited-send-' || nextval('audited_positions')) IS NOT NULL;
SQL
}
run >/dev/null <<<"GRANT SELECT ON idempotency.outbox TO auditor;"
for settings in "SET pgaudit.log = 'read';" "SET pgaudit.role = 'auditor';"; do
  direct=$(read_lines "$settings" on)
  statement=$(read_lines "$settings" off)
  grep -q 'READ,SELECT,.*idempotency.outbox' <<<"$statement" \
    || fail "$settings: pgaudit did not log the numbering check's read of the outbox: $statement"
  [ "$direct" = "$statement" ] || fail "$settings: pgaudit logged a keyed send otherwise with direct writes on:
$direct
and off:
$statement"
done
run >/dev/null <<<"REVOKE SELECT ON idempotency.outbox FROM auditor;"
echo "executor hooks: pgaudit logs a keyed send's numbering check alike with direct writes on and off"

# The nested INSERT appears in pg_stat_statements only when the statement path ran.
nested() {  # nested TRACK: how many times pg_stat_statements saw the claim's own INSERT
  run <<SQL | tail -1
SELECT pg_stat_statements_reset();
SET pg_stat_statements.track = '$1';
SELECT idem_claim('tracked-' || g) FROM generate_series(1, 3) AS g;
SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
WHERE query LIKE 'INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES%';
SQL
}
[ "$(nested top)" = 0 ] || fail "with track = top the claims were expected to write directly, unseen"
[ "$(nested all)" = 3 ] || fail "with track = all pg_stat_statements did not see the claims' INSERT: $(nested all)"
echo "executor hooks: pg_stat_statements.track = all sees every claim's INSERT"
# The setting is read on every claim: switched back and forth in one session, and inside a
# transaction with SET LOCAL, each claim follows the value in force.
switched=$(run <<'SQL' | tail -1
SELECT pg_stat_statements_reset();
SET pg_stat_statements.track = 'all';
SELECT idem_claim('switched-1-' || pg_backend_pid());
SET pg_stat_statements.track = 'top';
SELECT idem_claim('switched-2-' || pg_backend_pid());
BEGIN;
SET LOCAL pg_stat_statements.track = 'all';
SELECT idem_claim('switched-3-' || pg_backend_pid());
COMMIT;
SELECT idem_claim('switched-4-' || pg_backend_pid());
SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
WHERE query LIKE 'INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES%';
SQL
)
[ "$switched" = 2 ] || fail "pg_stat_statements.track switched in one session: expected 2 tracked INSERTs, saw $switched"

explained() {  # explained SETTINGS: the auto_explain plans logged for one claim
  run <<SQL | grep -c 'Insert on ledger' || true
LOAD 'auto_explain';
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
$1
SELECT idem_claim('explained-' || pg_backend_pid());
SQL
}
[ "$(explained "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = off;")" = 0 ] \
  || fail "auto_explain without nested statements was not expected to see the claim's INSERT"
[ "$(explained "SET auto_explain.log_min_duration = -1; SET auto_explain.log_nested_statements = on;")" = 0 ] \
  || fail "auto_explain switched off was not expected to see the claim's INSERT"
[ "$(explained "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;")" = 1 ] \
  || fail "auto_explain logging nested statements did not see the claim's INSERT"
# Loaded in the middle of a session that has already claimed: the settings SET before the
# LOAD were placeholders, which no hook reads; once it is loaded the next claim is logged.
late=$(run <<'SQL' | grep -c 'Insert on ledger' || true
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SELECT idem_claim('before-load-' || pg_backend_pid());
LOAD 'auto_explain';
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
SELECT idem_claim('after-load-' || pg_backend_pid());
SQL
)
[ "$late" = 1 ] || fail "auto_explain loaded after a claim did not see the next claim's INSERT (logged $late plans)"
echo "executor hooks: auto_explain with log_nested_statements sees the claim's INSERT"
psql -qX -d postgres -c "DROP DATABASE idem_hooks" -c "DROP ROLE auditor"
