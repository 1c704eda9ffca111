#!/usr/bin/env bash
# The ledger is extension configuration (pg_extension_config_dump): a dump and restore must
# bring back every claimed key, or the restored database would process them all again.
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
SQL
pg_dump -d idem_dump_src | psql -qX -v ON_ERROR_STOP=1 -d idem_dump_dst >/dev/null
got=$(psql -qXAt -v ON_ERROR_STOP=1 -d idem_dump_dst <<'SQL'
SELECT count(*) FILTER (WHERE idem_claim('order-' || i || ':paid')) FROM generate_series(1, 1000) AS i;
SELECT claimed, result FROM idem_claim_replay('order-1:paid', 'billing');
SELECT count(*) FROM idempotency.ledger;
SQL
)
expected=$'0\nf|{"invoice": 7}\n1001'
if [[ "$got" != "$expected" ]]; then
  printf 'dump/restore lost claims.\nexpected:\n%s\ngot:\n%s\n' "$expected" "$got"
  exit 1
fi
echo "dump/restore: 1001 claims and a stored result survived"
