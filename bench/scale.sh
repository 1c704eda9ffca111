#!/usr/bin/env bash
# `make bench-scale`: what a claim costs as the ledger grows (#13), beside the hand-written
# table a user would keep instead (scope, key, claimed_at; primary key (scope, key)), holding
# the same keys.
#
# For each size N and key kind, both tables are filled with N keys claimed at a constant rate
# over the scope's whole retention (26 days), as a month of traffic leaves them; then rounds
# of new claims alternate between the two, each window starting with a CHECKPOINT so that its
# full-page images count. Then one day of keys expires, and the purge is timed against the
# hand-written DELETE of the same rows. Reported per row: claims/s, WAL bytes and full-page
# images per claim, bytes per key, and the purge's time and WAL.
#
#   SCALE_SIZES        retained keys per phase      (default "1000000 30000000 100000000")
#   SCALE_KINDS        business ('payment|<n>', increasing) and/or uuid (random-looking)
#   SCALE_CHECKPOINTS  default (max_wal_size 1GB) and/or tuned (32GB, checkpoint_timeout 30min)
#   SCALE_SECONDS      seconds of each claims window (default 10)
#   SCALE_ROUNDS       windows per contender        (default 3)
#   SCALE_REPORT       where the summary table goes, dated, for bench/report.py
#                      (default docs/bench/scale.md, committed with the report)
#
# Each size and kind is filled once (with checkpoints spread out, as the fill is not
# measured), after the previous phase's rows are gone; a size that the data directory's free
# space cannot hold (about 300 bytes per key for both tables, and max_wal_size for pg_wal) is
# skipped with a note. Each checkpoint setting then measures its windows and purges a day of
# its own. At 1 M keys a 10 s window writes too little WAL for either setting to checkpoint
# inside it, so the two agree; they part where full-page images fill max_wal_size within
# seconds. Runs in the cluster the environment points at (PGHOST, PGPORT), as a superuser.
set -euo pipefail
shopt -s inherit_errexit
SIZES=${SCALE_SIZES:-"1000000 30000000 100000000"}
KINDS=${SCALE_KINDS:-"business uuid"}
CHECKPOINTS=${SCALE_CHECKPOINTS:-"default tuned"}
SECONDS_PER_WINDOW=${SCALE_SECONDS:-10}
ROUNDS=${SCALE_ROUNDS:-3}
DB=idem_scale
SCALE_REPORT=${SCALE_REPORT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/docs/bench/scale.md}
WORK=$(mktemp -d /tmp/idem_scale.XXXXXX)
trap 'checkpoints default >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

admin() { psql -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }
q() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$DB" "$@"; }

admin -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
admin -c "ALTER DATABASE $DB SET synchronous_commit = off"
q >/dev/null <<'SQL'
CREATE EXTENSION idempotency;
SELECT idem_declare_scope('scale', broker_retention => '25 days', buffer => '1 day');
CREATE TABLE hand_ledger (
    scope      text        NOT NULL,
    key        text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);
CREATE SEQUENCE next_key;
SQL

key_of() {  # key_of KIND EXPR: the SQL of key number EXPR
  case $1 in
    # Zero-padded, so that they increase as text too: each new key lands on the rightmost leaf.
    business) echo "'payment|' || lpad(($2)::text, 12, '0')" ;;
    uuid) echo "md5(($2)::text)::uuid::text" ;;
    *) echo "bench-scale: unknown key kind $1" >&2; exit 2 ;;
  esac
}

checkpoints() {  # checkpoints default|tuned
  case $1 in
    default) q -c "ALTER SYSTEM RESET max_wal_size" -c "ALTER SYSTEM RESET checkpoint_timeout" ;;
    tuned) q -c "ALTER SYSTEM SET max_wal_size = '32GB'" -c "ALTER SYSTEM SET checkpoint_timeout = '30min'" ;;
    *) echo "bench-scale: unknown checkpoint setting $1" >&2; exit 2 ;;
  esac
  q -c "SELECT pg_reload_conf()" >/dev/null
}

# The LSN and the full-page images written so far (pg_stat_wal, flushed by every backend
# at exit; a second's wait lets pgbench's backends get there).
wal_now() { sleep 1; q -F ' ' -c "SELECT pg_current_wal_insert_lsn(), wal_fpi FROM pg_stat_wal"; }
wal_since() {  # wal_since "LSN FPI": bytes and full-page images since then
  local lsn=${1% *} fpi=${1#* }
  q -F ' ' -c "SELECT pg_current_wal_insert_lsn() - '$lsn'::pg_lsn, wal_fpi - $fpi FROM pg_stat_wal"
}

fill() {  # fill KIND N: both tables hold keys 1..N, claimed evenly over the 26 days before now
  local key base
  key=$(key_of "$1" g)
  checkpoints tuned
  base=$(q -c "SELECT now()")
  local from=1 chunk=5000000
  while [ "$from" -le "$2" ]; do
    local to=$((from + chunk - 1)); [ "$to" -le "$2" ] || to=$2
    q -c "INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at)
          SELECT idem_digest($key, 'scale'), idem_scope_id('scale'), '$base'::timestamptz - interval '26 days' * (($2 - g) / $2::float8)
          FROM generate_series($from, $to) AS g" \
      -c "INSERT INTO hand_ledger (scope, key, claimed_at)
          SELECT 'scale', $key, '$base'::timestamptz - interval '26 days' * (($2 - g) / $2::float8) FROM generate_series($from, $to) AS g"
    from=$((to + 1))
  done
  q -c "VACUUM ANALYZE idempotency.ledger, hand_ledger" -c "SELECT setval('next_key', $2)" >/dev/null
  # As an upgraded ledger of this size moves over: the first purge (with the default
  # idempotency.ledger_buckets_from) makes the buckets and moves every claim into its own.
  # The few oldest keys expired while the fill ran: the hand-written table lets them go too.
  # A second run seals the buckets that ended, as the next scheduled purge would.
  q -c "CALL idem_purge(batch_blocks => 8192)" \
    -c "DELETE FROM hand_ledger WHERE claimed_at < (SELECT min(claimed_at) FROM idempotency.ledger)" \
    -c "VACUUM ANALYZE" -c "SELECT * FROM idempotency.maintain_ledger_buckets()" >/dev/null
}

# The ledger's bytes: the ledger itself and every bucket, with their indexes.
ledger_bytes() {
  q -c "SELECT sum(pg_total_relation_size(t)) FROM (SELECT 'idempotency.ledger'::regclass AS t UNION ALL
          SELECT i.inhrelid::regclass FROM pg_inherits AS i WHERE i.inhparent = 'idempotency.ledger'::regclass) AS x"
}

window() {  # window SCRIPT: one claims window; prints "tps wal_bytes_per_claim fpi_per_claim"
  # Autovacuum would put its WAL into whichever window it falls in (every table: a VACUUM
  # of the ledger does not reach its buckets).
  q -c "VACUUM" -c "CHECKPOINT"
  local before out n
  before=$(wal_now)
  out=$(pgbench -n -M prepared -c 2 -j 2 -T "$SECONDS_PER_WINDOW" -f "$1" "$DB" 2>&1)
  n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
  [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "bench-scale: pgbench failed: $out" >&2; exit 1; }
  local since
  since=$(sleep 1; wal_since "$before")
  read -r bytes fpi <<<"$since"
  awk -v n="$n" -v s="$SECONDS_PER_WINDOW" -v b="$bytes" -v f="$fpi" 'BEGIN { printf "%.0f %.0f %.4f\n", n / s, b / n, f / n }'
}

source "$(dirname "${BASH_SOURCE[0]}")/stats.sh"

measured() {  # measured SQL: SQL after a CHECKPOINT; prints "its value, seconds, WAL bytes"
  q -c "CHECKPOINT"
  local before t0 t1 value since
  before=$(wal_now); t0=$(date +%s.%N)
  value=$(q -c "$1")
  t1=$(date +%s.%N)
  since=$(sleep 1; wal_since "$before")
  echo "$value $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') ${since% *}"
}

purge_oldest() {  # the scope's retention shrinks to just past its oldest bucket, whose claims
  # expire; prints "ext_rows ext_s ext_wal hand_rows hand_s hand_wal". The DELETE takes the
  # rows older than the oldest claim the purge kept: the same keys, whatever time each cutoff
  # was read.
  q -c "SELECT idem_declare_scope('scale', broker_retention => date_trunc('minute', now() - min(b.ends_at)) - interval '1 day',
                                  buffer => '1 day')
        FROM idempotency.ledger_buckets AS b WHERE b.starts_at < now() - interval '1 day'" >/dev/null
  local ext cutoff
  ext=$(measured "CALL idem_purge()")
  cutoff=$(q -c "SELECT min(claimed_at) FROM idempotency.ledger")
  echo "$ext $(measured "WITH gone AS (DELETE FROM hand_ledger WHERE claimed_at < '$cutoff' RETURNING 1) SELECT count(*) FROM gone")"
}

data_dir=$(q -c "SHOW data_directory")
echo "== bench-scale: $(q -c 'SHOW server_version'), shared_buffers $(q -c 'SHOW shared_buffers'), synchronous_commit off, $SECONDS_PER_WINDOW s windows x $ROUNDS rounds, 2 clients"
RESULTS=$WORK/results
for n in $SIZES; do
  for kind in $KINDS; do
    q -c "TRUNCATE idempotency.ledger, hand_ledger" -c "CHECKPOINT"
    free=$(df --output=avail -B1 "$data_dir" | tail -1)
    # pg_wal grows towards max_wal_size (32GB when tuned) when the claims write enough.
    wal_room=$((n * 1000)); [ "$wal_room" -lt $((34 * 1024 * 1024 * 1024)) ] || wal_room=$((34 * 1024 * 1024 * 1024))
    need=$((n * 300 + wal_room))
    if [ "$free" -lt "$need" ]; then
      echo "$n $kind: skipped, $((free / 1000000)) MB free for about $((need / 1000000)) MB"
      continue
    fi
    key=$(key_of "$kind" "nextval('next_key')")
    echo "SELECT idem_claim($key, 'scale');" >"$WORK/ext.sql"
    echo "INSERT INTO hand_ledger (scope, key) VALUES ('scale', $key) ON CONFLICT DO NOTHING;" >"$WORK/hand.sql"
    t0=$(date +%s)
    fill "$kind" "$n"
    echo "   ($n $kind: filled in $(($(date +%s) - t0)) s)"
    ext_bytes=$(q -c "SELECT $(ledger_bytes) / $n::float8")
    hand_bytes=$(q -c "SELECT pg_total_relation_size('hand_ledger') / $n::float8")
    # The fill's oldest keys purged so far (keys are numbered from 1 by age).
    gone=$((n - $(q -c "SELECT count(*) FROM hand_ledger")))
    for setting in $CHECKPOINTS; do
      checkpoints "$setting"
      declare -A tps=() wal=() fpi=()
      for ((r = 1; r <= ROUNDS; r++)); do
        for who in ext hand; do
          result=$(window "$WORK/$who.sql")
          read -r t w f <<<"$result"
          tps[$who]+=" $t" wal[$who]+=" $w" fpi[$who]+=" $f"
        done
      done
      result=$(purge_oldest)
      read -r er es ew hr hs hw <<<"$result"
      # What the figures stand on: the purge took exactly the claims the DELETE took, the
      # newest key is still a duplicate, the oldest purged one is claimable again.
      if [ "$er" != "$hr" ] || [ "$er" -lt 1 ] ||
         [ "$(q -c "SELECT idem_claim($(key_of "$kind" "$n"), 'scale')")" != f ] ||
         [ "$(q -c "SELECT idem_claim($(key_of "$kind" $((gone + 1))), 'scale')")" != t ]; then
        echo "bench-scale: $setting $n $kind: the purge deleted $er claims where the DELETE took $hr, or kept the wrong ones" >&2
        exit 1
      fi
      gone=$((gone + hr))
      line=$(awk -v s="$setting" -v n="$n" -v k="$kind" \
        -v et="$(median <<<"${tps[ext]}")" -v ht="$(median <<<"${tps[hand]}")" \
        -v ew="$(median <<<"${wal[ext]}")" -v hw="$(median <<<"${wal[hand]}")" \
        -v ef="$(median <<<"${fpi[ext]}")" -v hf="$(median <<<"${fpi[hand]}")" \
        -v eb="$ext_bytes" -v hb="$hand_bytes" -v er="$er" -v es="$es" -v pw="$ew" -v hr="$hr" -v hs="$hs" -v dw="$hw" \
        'BEGIN { printf "| %s | %d | %s | %.0f | %.0f | %.2f | %.0f / %.0f | %.3f / %.3f | %.0f / %.0f | %d in %.2f s, %.0f kB | %d in %.2f s, %.0f kB | %.3f |\n",
                 s, n, k, et, ht, et / ht, ew, hw, ef, hf, eb, hb, er, es, pw / 1e3, hr, hs, dw / 1e3, (dw > 0 ? pw / dw : 0) }')
      echo "$line" | tee -a "$RESULTS"
      echo "   (claims/s per round: ext${tps[ext]}, hand${tps[hand]})"
      unset tps wal fpi
    done
  done
done
checkpoints default
q -c "TRUNCATE idempotency.ledger, hand_ledger"

echo
echo "== summary =="
mkdir -p "$(dirname "$SCALE_REPORT")"
{
  echo "Run on $(date -u '+%Y-%m-%d %H:%M UTC'), PostgreSQL $(q -c 'SHOW server_version'), $(nproc) cores: sizes $SIZES, keys $KINDS, checkpoints $CHECKPOINTS, $SECONDS_PER_WINDOW s windows x $ROUNDS rounds."
  echo
  echo "| checkpoints | keys retained | keys | idem_claim/s | hand/s | ratio | WAL B/claim ext / hand | FPI/claim ext / hand | bytes/key ext / hand | purge of one day (idem_purge) | DELETE of the same day | purge WAL / DELETE WAL |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  cat "$RESULTS" 2>/dev/null || true
} | tee "$SCALE_REPORT"
