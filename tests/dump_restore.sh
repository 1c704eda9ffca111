#!/usr/bin/env bash
# The ledger is extension configuration (pg_extension_config_dump): a dump and restore must
# bring back every claimed key, or the restored database would process them all again; so
# must the watermarks, the external calls begun and confirmed, and the recorded duplicates.
set -euo pipefail
psql -qX -v ON_ERROR_STOP=1 -d postgres <<'SQL'
SET client_min_messages = warning;
DROP DATABASE IF EXISTS idem_dump_src;
DROP DATABASE IF EXISTS idem_dump_dst;
CREATE DATABASE idem_dump_src;
CREATE DATABASE idem_dump_dst;
SQL
psql -qXAt -v ON_ERROR_STOP=1 -d idem_dump_src <<'SQL' >/dev/null
CREATE EXTENSION idempotency;
SELECT idem_claim('order-' || i || ':paid') FROM generate_series(1, 1000) AS i;
SELECT idem_claim('order-1:paid', 'billing');
SELECT idem_set_result('order-1:paid', '{"invoice": 7}', 'billing');
SELECT idem_watermark_advance('payments', 3, 41);
SET idempotency.diagnostics = on;
SELECT idem_claim('order-' || i || ':paid') FROM generate_series(1, 3) AS i;
RESET idempotency.diagnostics;
-- Buckets made at run time (#13) are tables of their own, dumped with their rows.
SET idempotency.ledger_buckets_from = 0;
SELECT idem_declare_scope('shipping', '3 days');
SELECT * FROM idempotency.maintain_ledger_buckets();
SELECT idem_claim('parcel-' || i, 'shipping'), idem_claim('bucketed-' || i) FROM generate_series(1, 200) AS i;
-- Claims of two days ago left in the ledger itself: the purge moves them into a bucket of
-- theirs (and the rest into the current ones), then seals it, with its trigger.
INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at)
SELECT idem_digest('sealed-' || i), idem_scope_id('default'), now() - interval '2 days' FROM generate_series(1, 50) AS i;
CALL idem_purge();
SELECT * FROM idempotency.maintain_ledger_buckets();
SQL
# The external-call ledger's steps each run on their own (not inside a transaction block).
psql -qXAt -v ON_ERROR_STOP=1 -d idem_dump_src -c "SELECT state FROM idem_call_begin('order-1:paid', 'billing', 'charge')" \
  -c "SELECT idem_call_confirm('order-1:paid', 'billing', 'charge', '{\"charge_id\": \"ch_1\"}')" \
  -c "SELECT state FROM idem_call_begin('order-2:paid', 'billing', 'charge')" >/dev/null
pg_dump -d idem_dump_src | psql -qX -v ON_ERROR_STOP=1 -d idem_dump_dst >/dev/null
got=$(psql -qXAt -v ON_ERROR_STOP=1 -d idem_dump_dst <<'SQL'
SELECT count(*) FILTER (WHERE idem_claim('order-' || i || ':paid')) FROM generate_series(1, 1000) AS i;
SELECT count(*) FILTER (WHERE idem_claim('parcel-' || i, 'shipping') OR idem_claim('bucketed-' || i))
FROM generate_series(1, 200) AS i;
SELECT count(*) FILTER (WHERE idem_claim('sealed-' || i)) FROM generate_series(1, 50) AS i;
SELECT bool_and(to_regclass(pg_catalog.format('idempotency.%I', b.bucket)) IN
                (SELECT i.inhrelid FROM pg_inherits AS i WHERE i.inhparent = 'idempotency.ledger'::regclass)),
       count(*) FILTER (WHERE b.sealed_at IS NOT NULL AND EXISTS (
         SELECT FROM pg_trigger AS t WHERE t.tgname = 'bucket_sealed'
           AND t.tgrelid = pg_catalog.format('idempotency.%I', b.bucket)::regclass)) > 0
FROM idempotency.ledger_buckets AS b;
SELECT claimed, result FROM idem_claim_replay('order-1:paid', 'billing');
SELECT count(*) FROM idempotency.ledger;
SELECT idem_watermark_advance('payments', 3, 41), idem_watermark('payments', 3);
SELECT state, response FROM idem_call_begin('order-1:paid', 'billing', 'charge');
SELECT state FROM idem_call_begin('order-2:paid', 'billing', 'charge');
SELECT count(*) FROM idempotency.duplicates;
-- The next recorded duplicate is numbered after the restored ones.
SET idempotency.diagnostics = on;
SELECT idem_claim('order-4:paid');
SELECT count(DISTINCT id) FROM idempotency.duplicates;
SQL
)
expected=$'0\n0\n0\nt|t\nf|{"invoice": 7}\n1451\nf|41\nconfirmed|{"charge_id": "ch_1"}\nin_doubt\n3\nf\n4'
if [[ "$got" != "$expected" ]]; then
  printf 'dump/restore lost claims.\nexpected:\n%s\ngot:\n%s\n' "$expected" "$got"
  exit 1
fi
echo "dump/restore: 1451 claims (all in buckets, 50 in a sealed one), a stored result, a watermark, the external-call ledger and the recorded duplicates survived"

# A ledger extended as README's "Extending the ledger" shows: pg_dump keeps its rows, not the
# change, so a plain restore stops at the ledger's rows (it must fail, never finish without
# them), and README's three steps restore every key with its added column.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
cat > ledger_changes.sql <<'SQL'
ALTER TABLE idempotency.ledger ADD COLUMN tenant text DEFAULT current_user;
CREATE INDEX ledger_tenant ON idempotency.ledger (tenant);
SQL
psql -qX -v ON_ERROR_STOP=1 -d postgres <<'SQL'
SET client_min_messages = warning;
DROP DATABASE IF EXISTS app;
DROP DATABASE IF EXISTS restored;
DROP DATABASE IF EXISTS restored_plain;
CREATE DATABASE app;
CREATE DATABASE restored;
CREATE DATABASE restored_plain;
SQL
psql -qXAt -v ON_ERROR_STOP=1 -d app -c "CREATE EXTENSION idempotency" -f ledger_changes.sql \
  -c "SELECT count(*) FILTER (WHERE idem_claim('order-' || i)) FROM generate_series(1, 100) AS i" >/dev/null
if pg_dump -d app | psql -qX -v ON_ERROR_STOP=1 -d restored_plain >/dev/null 2>plain.err; then
  echo "dump/restore: a plain restore of an extended ledger finished; it must stop at the ledger's rows"
  exit 1
fi
grep -q 'column "tenant" of relation "ledger" does not exist' plain.err ||
  { echo "dump/restore: the plain restore failed otherwise:"; cat plain.err; exit 1; }
pg_dump -Fc -f app.dump app
pg_restore --section=pre-data --exit-on-error -d restored app.dump
psql -v ON_ERROR_STOP=1 -d restored -f ledger_changes.sql
pg_restore --section=data --section=post-data --exit-on-error -d restored app.dump
got=$(psql -qXAt -v ON_ERROR_STOP=1 -d restored \
  -c "SELECT count(*) FILTER (WHERE idem_claim('order-' || i)) FROM generate_series(1, 100) AS i" \
  -c "SELECT count(*), count(DISTINCT tenant) FROM idempotency.ledger WHERE tenant IS NOT NULL" \
  -c "SELECT count(*) FROM pg_indexes WHERE indexname = 'ledger_tenant'")
if [[ "$got" != $'0\n100|1\n1' ]]; then
  printf 'dump/restore of an extended ledger: expected no new claim, 100 rows with their tenant and the index; got:\n%s\n' "$got"
  exit 1
fi
psql -qX -d postgres -c "DROP DATABASE app" -c "DROP DATABASE restored" -c "DROP DATABASE restored_plain"
echo "dump/restore: an extended ledger kept its 100 claims and its column through the three-step restore"
