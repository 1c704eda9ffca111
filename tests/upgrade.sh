#!/usr/bin/env bash
# Upgrades from every released version (RELEASES) to the one this tree builds:
#   1. install the release from its frozen script (sql/released/), store claims, results,
#      fingerprints, scopes and versioned rows through it, with this tree's library;
#   2. `ALTER EXTENSION idempotency UPDATE`;
#   3. every stored key is still recognised, every result replays, every fingerprint still
#      guards its key, the versioned rows keep their versions;
#   4. the updated extension's objects are exactly a fresh install's.
# With UPGRADE_ONLY_PATH=1 it instead leaves the frozen scripts installed and the current
# version's own script aside, so that every CREATE EXTENSION of the suites that follow goes
# through the upgrade scripts (tests/run-in-cluster.sh's "upgraded" pass); the caller
# restores with UPGRADE_RESTORE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ext_dir="$(pg_config --sharedir)/extension"
current=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
released=$(awk '!/^#/ && NF { print $1 }' RELEASES)

install_frozen() {
  for v in $released; do
    [[ "$v" == "$current" ]] && continue
    install -m 644 "sql/released/idempotency--$v.sql" "$ext_dir/"
  done
}

if [[ "${UPGRADE_RESTORE:-}" == 1 ]]; then
  [[ -f "$ext_dir/idempotency--$current.sql.aside" ]] &&
    mv "$ext_dir/idempotency--$current.sql.aside" "$ext_dir/idempotency--$current.sql"
  exit 0
fi
# Once the version this tree builds is released, its SQL is frozen too: any change to a SQL
# object needs the next version and an upgrade script to it. pgrx marks each object with the
# Rust line that declared it ("-- src/claim.rs:42"); those comments are not SQL, so code may
# move without a release.
without_locations() { grep -v -E '^-- [A-Za-z0-9_/]+\.rs:[0-9]+$' "$1"; }
if grep -qx "$current" <<<"$released" &&
   ! diff -q <(without_locations "sql/released/idempotency--$current.sql") \
             <(without_locations "$ext_dir/idempotency--$current.sql") >/dev/null; then
  echo "upgrade: the SQL this tree builds for $current differs from the released script"
  echo "  (sql/released/idempotency--$current.sql); bump the version in Cargo.toml and write"
  echo "  sql/idempotency--$current--<next>.sql instead:"
  diff <(without_locations "sql/released/idempotency--$current.sql") \
       <(without_locations "$ext_dir/idempotency--$current.sql") | head -40
  exit 1
fi
install_frozen
if [[ "${UPGRADE_ONLY_PATH:-}" == 1 ]]; then
  mv "$ext_dir/idempotency--$current.sql" "$ext_dir/idempotency--$current.sql.aside"
  exit 0
fi

q() { psql -qXAt -v ON_ERROR_STOP=1 "$@"; }

# The extension's own objects, each with its full definition and comment, in a stable order.
catalog() {
  q -d "$1" <<'SQL'
SELECT pg_describe_object(d.classid, d.objid, 0) || E'\n  ' ||
       coalesce(CASE d.classid
         WHEN 'pg_proc'::regclass THEN pg_get_functiondef(d.objid)
         WHEN 'pg_class'::regclass THEN (
           SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
                             CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END ||
                             coalesce(' DEFAULT ' || pg_get_expr(ad.adbin, ad.adrelid), ''), ', ' ORDER BY a.attnum)
           FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
           WHERE a.attrelid = d.objid AND a.attnum > 0 AND NOT a.attisdropped) || E'\n  ' || coalesce((
           SELECT string_agg(pg_get_indexdef(i.indexrelid), E'\n  ' ORDER BY 1) FROM pg_index i WHERE i.indrelid = d.objid), '') ||
           E'\n  ' || coalesce((
           SELECT string_agg(conname || ' ' || pg_get_constraintdef(c.oid), E'\n  ' ORDER BY conname)
           FROM pg_constraint c WHERE c.conrelid = d.objid), '') ||
           E'\n  acl ' || coalesce((SELECT relacl::text FROM pg_class WHERE oid = d.objid), '')
         END, '') || E'\n  comment ' || coalesce(obj_description(d.objid, d.classid::regclass::name), '')
FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
WHERE e.extname = 'idempotency' AND d.deptype = 'e'
ORDER BY 1;
SQL
}

q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS idem_upgrade_fresh" \
  -c "CREATE DATABASE idem_upgrade_fresh"
q -d idem_upgrade_fresh -c "CREATE EXTENSION idempotency"
fresh=$(catalog idem_upgrade_fresh)

for from in $released; do
  [[ "$from" == "$current" ]] && continue
  db=idem_upgrade_from_${from//./_}
  q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
  # Stored through the old SQL by this tree's library: the library must keep serving every
  # version's SQL until the DBA runs the update.
  q -d "$db" <<SQL >/dev/null
CREATE EXTENSION idempotency VERSION '$from';
SELECT idem_claim('order-' || i || ':paid') FROM generate_series(1, 500) AS i;
SELECT idem_claim('order-' || i || ':refund', 'billing', jsonb_build_object('order', i)) FROM generate_series(1, 50) AS i;
SELECT idem_set_result('order-7:refund', '{"refund": 7}', 'billing');
SELECT idem_claim_many(ARRAY['batch-1', 'batch-2', 'batch-1'], 'imports');
CREATE TABLE accounts (id int PRIMARY KEY, balance numeric, version bigint);
SELECT idem_versioned_upsert('accounts', jsonb_build_object('id', i, 'balance', i * 10, 'version', 5)) FROM generate_series(1, 20) AS i;
SELECT idem_versioned_update('accounts', '{"id": 3}', '{"balance": 33, "version": 6}');
-- A retention 0.5.0 refuses, declared where the release took it, with a claim of its scope:
-- after the update the purge must still run, and keep that claim.
DO \$\$ BEGIN PERFORM idem_declare_scope('legacy-eon', '10000 years'); EXCEPTION WHEN OTHERS THEN NULL; END \$\$;
SELECT idem_claim('eon-1', 'legacy-eon');
UPDATE idempotency.ledger SET claimed_at = now() - interval '400 days' WHERE key_digest = idem_digest('eon-1', 'legacy-eon');
-- Duplicates recorded where the release has diagnostics (0.4.0): the update gives them a key.
SET idempotency.diagnostics = on;
SELECT idem_claim('order-' || i || ':paid') FROM generate_series(1, 3) AS i
WHERE pg_catalog.to_regclass('idempotency.duplicates') IS NOT NULL;
SQL
  recorded=0
  if [ "$(q -d "$db" -c "SELECT to_regclass('idempotency.duplicates') IS NOT NULL")" = t ]; then
    recorded=$(q -d "$db" -c "SELECT count(*) FROM idempotency.duplicates")
  fi
  before=$(q -d "$db" -c "SELECT count(*) FROM idempotency.ledger")
  q -d "$db" -c "ALTER EXTENSION idempotency UPDATE"
  version=$(q -d "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
  got=$(q -d "$db" <<'SQL'
SELECT count(*) FROM idempotency.ledger;
CALL idem_purge();
SELECT count(*) FROM idempotency.ledger WHERE key_digest = idem_digest('eon-1', 'legacy-eon');
SELECT count(*) FILTER (WHERE idem_claim('order-' || i || ':paid')) FROM generate_series(1, 500) AS i;
SELECT count(*) FILTER (WHERE idem_claim('order-' || i || ':refund', 'billing', jsonb_build_object('order', i))) FROM generate_series(1, 50) AS i;
SELECT claimed, result FROM idem_claim_replay('order-7:refund', 'billing');
SELECT idem_claim_many(ARRAY['batch-2', 'batch-3'], 'imports');
DO $$ BEGIN PERFORM idem_claim('order-1:refund', 'billing', '{"order": 2}'); RAISE 'no error';
      EXCEPTION WHEN SQLSTATE 'ID001' THEN RAISE NOTICE 'ID001'; END $$;
SELECT idem_versioned_update('accounts', '{"id": 3}', '{"balance": 1, "version": 6}');
-- 0.5.0: a NULL scope and a retention now() cannot subtract are refused, not taken.
DO $$ BEGIN PERFORM idem_forget_scope(NULL); RAISE 'idem_forget_scope(NULL) answered';
      EXCEPTION WHEN SQLSTATE '22004' THEN NULL; END $$;
DO $$ BEGIN PERFORM idem_declare_scope('eon', '10000 years'); RAISE 'a 10000-year retention was declared';
      EXCEPTION WHEN SQLSTATE '22023' THEN NULL; END $$;
SELECT string_agg(id || ':' || balance || ':' || version, ' ' ORDER BY id) FROM accounts WHERE id IN (1, 3);
-- 0.5.0: recorded duplicates have a primary key, numbered on after those recorded before.
SET idempotency.diagnostics = on;
SELECT idem_claim('order-4:paid');
SELECT count(*), count(DISTINCT id) FROM idempotency.duplicates;
SQL
  )
  expected=$'553\n0\n1\n0\n0\nf|{"refund": 7}\n{f,t}\nf\n1:10:5 3:33:6\nf\n'"$((recorded + 1))|$((recorded + 1))"
  if [[ "$version" != "$current" || "$before" != 553 || "$got" != "$expected" ]]; then
    printf 'upgrade from %s: to %s (want %s), %s keys before (want 553)\nexpected:\n%s\ngot:\n%s\n' \
      "$from" "$version" "$current" "$before" "$expected" "$got"
    exit 1
  fi
  if ! diff <(echo "$fresh") <(catalog "$db") >/tmp/idem-upgrade.diff; then
    echo "upgrade from $from: the updated objects differ from a fresh install of $current (< fresh, > updated):"
    cat /tmp/idem-upgrade.diff
    exit 1
  fi
  echo "upgrade $from -> $current: 553 stored keys recognised (and a legacy 10000-year scope purged without error), result replayed, fingerprint kept, $recorded recorded duplicates kept, objects as a fresh install"
done

# A populated 0.1.0 ledger of a million claims moves into buckets (#13): the update changes
# no row and takes no long lock; once the ledger holds idempotency.ledger_buckets_from claims
# (a million), each purge makes buckets and moves the ledger's own claims into them, batch by
# batch, while every key stays a duplicate.
oldest=$(head -1 <<<"$released")
db=idem_upgrade_million
q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
q -d "$db" <<SQL >/dev/null
CREATE EXTENSION idempotency VERSION '$oldest';
SELECT idem_declare_scope('payments', '3 days');
INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at)
SELECT idem_digest('m-' || i, CASE WHEN i % 4 = 0 THEN 'payments' ELSE 'default' END),
       idem_scope_id(CASE WHEN i % 4 = 0 THEN 'payments' ELSE 'default' END),
       now() - (i % 144) * interval '1 hour' - interval '30 minutes'
FROM generate_series(1, 1000000) AS i;
ANALYZE idempotency.ledger;
SQL
q -d "$db" -c "ALTER EXTENSION idempotency UPDATE"
got=$(q -d "$db" <<'SQL'
SELECT count(*) FROM idempotency.ledger_buckets;
CALL idem_purge(batch_blocks => 2048);
SELECT deleted + moved FROM idempotency.purge_runs ORDER BY run_id DESC LIMIT 1;
SELECT count(*) FROM ONLY idempotency.ledger;
SELECT count(*) FROM idempotency.ledger;
-- Every unexpired key is there (a hash join over them all: the missing ones are the expired),
-- and claims of a sample answer "duplicate", but for its expired keys.
SELECT count(*) FROM generate_series(1, 1000000) AS i
LEFT JOIN idempotency.ledger AS l
       ON l.key_digest = idem_digest('m-' || i, CASE WHEN i % 4 = 0 THEN 'payments' ELSE 'default' END)
WHERE l.key_digest IS NULL;
SELECT count(*) FILTER (WHERE idem_claim('m-' || i, CASE WHEN i % 4 = 0 THEN 'payments' ELSE 'default' END))
FROM generate_series(1, 1000000, 997) AS i;
SQL
)
# Payments claims (i a multiple of 4) keep 4 days (3 and a day's buffer): those 96.5 to 140.5
# hours old expired, 12 in every 144 keys; the default scope's keep 7 days, so none of them.
expired=83328
# CALL idem_purge answers how many it deleted; a sampled expired key is new again.
expected=$'0\n'"$expired"$'\n1000000\n0\n'"$((1000000 - expired))"$'\n'"$expired"$'\n84'
if [[ "$got" != "$expected" ]]; then
  printf 'upgrade of a million claims into buckets:\nexpected:\n%s\ngot:\n%s\n' "$expected" "$got"
  exit 1
fi
echo "upgrade $oldest -> $current with 1,000,000 claims: the purge moved them into buckets, every unexpired key recognised"
q -d postgres -c "DROP DATABASE $db"
