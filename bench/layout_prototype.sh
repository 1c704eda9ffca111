#!/usr/bin/env bash
# The SQL-level prototype behind docs/ledger-layout.md (#13): what a claim costs against N
# retained keys when the ledger is one table of digests (today), when it is time buckets
# probed one by one (7 sealed buckets plus the current one), and when it is a hand-written
# table of increasing business keys. Plain tables and statements, no extension: it measures
# the layouts, not our code.
#
#   LAYOUT_KEYS     retained keys (default 30000000; the sealed buckets hold 7/8 of them and
#                   the current one half a bucket)
#   LAYOUT_SECONDS  seconds per window (default 10), LAYOUT_ROUNDS rounds (default 3)
#
# Each window starts with a CHECKPOINT, so that its full-page images count. Runs in the
# cluster the environment points at (PGHOST, PGPORT), in a database of its own, as a superuser:
#   pg_virtualenv -t -v 15 -o ssl=off -o synchronous_commit=off bash bench/layout_prototype.sh
set -euo pipefail
shopt -s inherit_errexit
N=${LAYOUT_KEYS:-30000000}
SECONDS_PER_WINDOW=${LAYOUT_SECONDS:-10}
ROUNDS=${LAYOUT_ROUNDS:-3}
DB=idem_layout
WORK=$(mktemp -d /tmp/idem_layout.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "SET client_min_messages = warning" \
  -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
q() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$DB" "$@"; }

bucket=$((N / 8))
# Digests of 'k' || i stand in for the ledger's: random, as every digest is. Indexes are
# built after the fill, so they are denser than a grown ledger's: that flatters the single
# table, not the buckets.
q -v n="$N" -v bucket="$bucket" <<'SQL'
CREATE TABLE hand (scope text NOT NULL, key text NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now());
INSERT INTO hand SELECT 'scale', 'payment|' || lpad(i::text, 12, '0'), now() - interval '26 days' * (1 - i / :n::float8)
FROM generate_series(1, :n) AS i;
ALTER TABLE hand ADD PRIMARY KEY (scope, key);

CREATE TABLE single (key_digest uuid NOT NULL, scope_id int8 NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now(),
                     fingerprint uuid, result jsonb);
INSERT INTO single SELECT md5('k' || i)::uuid, 42, now() - interval '26 days' * (1 - i / :n::float8)
FROM generate_series(1, :n) AS i;
ALTER TABLE single ADD PRIMARY KEY (key_digest);

CREATE TABLE sealed (key_digest uuid NOT NULL, scope_id int8 NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now(),
                     fingerprint uuid, result jsonb, b int NOT NULL) PARTITION BY LIST (b);
SELECT format('CREATE TABLE sealed_%s PARTITION OF sealed FOR VALUES IN (%s)', b, b) FROM generate_series(0, 6) AS b \gexec
INSERT INTO sealed SELECT md5('k' || i)::uuid, 42, now() - interval '26 days' * (1 - i / :n::float8), NULL, NULL,
                          (i - 1) / :bucket
FROM generate_series(1, 7 * :bucket) AS i;
SELECT format('ALTER TABLE sealed_%s ADD PRIMARY KEY (key_digest)', b) FROM generate_series(0, 6) AS b \gexec

CREATE TABLE hot (key_digest uuid NOT NULL, scope_id int8 NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now(),
                  fingerprint uuid, result jsonb);
INSERT INTO hot SELECT md5('k' || i)::uuid, 42, now() - interval '26 days' * (1 - i / :n::float8)
FROM generate_series(7 * :bucket + 1, 7 * :bucket + :bucket / 2) AS i;
ALTER TABLE hot ADD PRIMARY KEY (key_digest);

-- New claims draw keys no table holds.
SELECT format('CREATE SEQUENCE next_key START %s', 2 * :n) \gexec
VACUUM ANALYZE;
SQL

# One statement per contender; the k CTE and OFFSET 0 evaluate nextval once per transaction.
new_digest="md5('k' || nextval('next_key'))::uuid"
cat >"$WORK/hand.sql" <<SQL
INSERT INTO hand (scope, key) VALUES ('scale', 'payment|' || lpad(nextval('next_key')::text, 12, '0')) ON CONFLICT DO NOTHING;
SQL
cat >"$WORK/single.sql" <<SQL
INSERT INTO single (key_digest, scope_id) VALUES ($new_digest, 42) ON CONFLICT (key_digest) DO NOTHING;
SQL
cat >"$WORK/buckets.sql" <<SQL
WITH k AS (SELECT $new_digest AS d)
INSERT INTO hot (key_digest, scope_id) SELECT d, 42 FROM k WHERE NOT EXISTS (SELECT FROM sealed AS s WHERE s.key_digest = k.d)
ON CONFLICT (key_digest) DO NOTHING;
SQL
cat >"$WORK/current_only.sql" <<SQL
INSERT INTO hot (key_digest, scope_id) VALUES ($new_digest, 42) ON CONFLICT (key_digest) DO NOTHING;
SQL
cat >"$WORK/probes_only.sql" <<SQL
SELECT FROM sealed AS s, (SELECT $new_digest AS d OFFSET 0) AS k WHERE s.key_digest = k.d;
SQL

echo "| round | contender | claims/s | WAL B/claim | FPI/claim |"
echo "|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  for contender in hand single buckets current_only probes_only; do
    q -c "CHECKPOINT"
    read -r lsn fpi < <(q -F ' ' -c "SELECT pg_current_wal_insert_lsn(), wal_fpi FROM pg_stat_wal")
    done_tx=$(pgbench -n -M prepared -c 2 -j 2 -T "$SECONDS_PER_WINDOW" -f "$WORK/$contender.sql" "$DB" |
              awk '/number of transactions actually processed/ { split($NF, a, "/"); print a[1] }')
    # pg_stat_wal counts what pgbench's backends flushed at exit; a second lets them get there.
    sleep 1
    read -r wal dfpi < <(q -F ' ' -c "SELECT pg_current_wal_insert_lsn() - '$lsn'::pg_lsn, wal_fpi - $fpi FROM pg_stat_wal")
    awk -v r="$round" -v c="$contender" -v n="$done_tx" -v t="$SECONDS_PER_WINDOW" -v w="$wal" -v f="$dfpi" \
      'BEGIN { printf "| %d | %s | %.0f | %.0f | %.4f |\n", r, c, n / t, w / n, f / n }'
  done
done
psql -X -q -d postgres -c "DROP DATABASE $DB WITH (FORCE)"
