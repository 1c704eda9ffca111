#!/usr/bin/env bash
# make bench's scripts, briefly, so that they cannot rot: every contender runs and every check
# in them holds, and bench/report.py draws its table and chart from what they wrote. No figure
# is judged. Runs in the cluster the environment points at; writes nothing into the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/idem_bench_smoke.XXXXXX)
trap 'rm -rf "$work"' EXIT
major=$(( $(psql -X -A -t -d postgres -c 'SHOW server_version_num') / 10000 ))
env BENCH_SECONDS=1 BENCH_ROUNDS=1 PURGE_ROUNDS=1 BENCH_KEYS=2000 PURGE_KEYS=5000 PURGE_SECONDS=1 \
  DRAIN_MESSAGES=300 DRAIN_ROUNDS=1 STEADY_SECONDS=20 RELAY_PROFILE=debug \
  BENCH_TSV="$work/results/bench-pg$major.tsv" bash bench/run.sh
printf '# x\n\n<!-- bench:begin -->\nold\n<!-- bench:end -->\n\nafter\n' > "$work/README.md"
/usr/bin/python3 bench/report.py "$work/results" "$work/README.md" "$work/out"
fail() { echo "bench_smoke: $*" >&2; exit 1; }
# Every judged measure has its row, with a verdict, in the report and in the README's block.
for what in 'idem_claim' 'idem_versioned_update' 'claim + insert + idem_send' 'consumer tx, idem_claim' 'bytes per key'; do
  grep -qE "^\| $(printf '%s' "$what" | sed 's/[+.]/\\&/g') \| .*(✓|\*\*MISS\*\*)" "$work/out/report.md" || fail "no judged row '$what' in the report"
  grep -qF "| $what |" "$work/README.md" || fail "no row '$what' in the README's block"
done
# The drain's judged row, and beside it the hand relays held to as many messages in flight.
grep -F '| drain, 200 keys, 4 relay(s) |' "$work/out/report.md" | grep -qE '✓|\*\*MISS\*\*' || fail "no judged drain row in the report"
grep -qF '| drain, 200 keys, 4 relay(s), as many in flight | ' "$work/out/report.md" || fail "no row of the drain at as many messages in flight"
grep -q "^- \*\*pg$major\*\*: PostgreSQL" "$work/README.md" || fail "the README's block does not say where it ran"
grep -q '^old$' "$work/README.md" && fail "the README's old block is still there"
grep -q '^after$' "$work/README.md" || fail "the README lost what follows the block"
[ "$(head -c 8 "$work/out/ratios.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "ratios.png is not a PNG"
echo "bench_smoke: report and chart written for pg$major"
