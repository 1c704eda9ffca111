#!/usr/bin/env bash
# The ledger is extension configuration (pg_extension_config_dump): a dump and restore must
# bring back every claimed key, or the restored database would process them all again; so
# must the watermarks, and the external calls begun and confirmed.
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
SQL
# The external-call ledger's steps each run on their own (not inside a transaction block).
psql -qXAt -v ON_ERROR_STOP=1 -d idem_dump_src -c "SELECT state FROM idem_call_begin('order-1:paid', 'billing', 'charge')" \
  -c "SELECT idem_call_confirm('order-1:paid', 'billing', 'charge', '{\"charge_id\": \"ch_1\"}')" \
  -c "SELECT state FROM idem_call_begin('order-2:paid', 'billing', 'charge')" >/dev/null
pg_dump -d idem_dump_src | psql -qX -v ON_ERROR_STOP=1 -d idem_dump_dst >/dev/null
got=$(psql -qXAt -v ON_ERROR_STOP=1 -d idem_dump_dst <<'SQL'
SELECT count(*) FILTER (WHERE idem_claim('order-' || i || ':paid')) FROM generate_series(1, 1000) AS i;
SELECT claimed, result FROM idem_claim_replay('order-1:paid', 'billing');
SELECT count(*) FROM idempotency.ledger;
SELECT idem_watermark_advance('payments', 3, 41), idem_watermark('payments', 3);
SELECT state, response FROM idem_call_begin('order-1:paid', 'billing', 'charge');
SELECT state FROM idem_call_begin('order-2:paid', 'billing', 'charge');
SQL
)
expected=$'0\nf|{"invoice": 7}\n1001\nf|41\nconfirmed|{"charge_id": "ch_1"}\nin_doubt'
if [[ "$got" != "$expected" ]]; then
  printf 'dump/restore lost claims.\nexpected:\n%s\ngot:\n%s\n' "$expected" "$got"
  exit 1
fi
echo "dump/restore: 1001 claims, a stored result, a watermark and the external-call ledger survived"
