#!/usr/bin/env bash
# tests/leak_sentinel.sh against sample logs, without a server. For each major with a list in
# tests/leak-patterns/: each line of samples/MAJOR.log (the texts of its sources, as a log
# shows them) must fail it on its own, each pattern must match a sample (so none goes
# untested), and samples/clean.log (lines the suites do log: ID004 and ID005 warnings, failed
# pg_cron jobs, killed clients) must pass.
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=""
majors=""
for list in leak-patterns/[0-9]*; do
  major=${list##*/} samples=leak-patterns/samples/${list##*/}.log
  majors+=" $major"
  bash leak_sentinel.sh leak-patterns/samples/clean.log "$major" >/dev/null ||
    failed+=$'\n'"  PostgreSQL $major: a line of samples/clean.log counts as a leak"
  while IFS= read -r line; do
    printf '%s\n' "$line" >"$tmp/one.log"
    status=0
    bash leak_sentinel.sh "$tmp/one.log" "$major" >/dev/null || status=$?
    [ "$status" = 1 ] || failed+=$'\n'"  PostgreSQL $major: not caught (exit $status): $line"
  done <"$samples"
  while IFS= read -r pattern; do
    grep -q -E -e "$pattern" "$samples" || failed+=$'\n'"  PostgreSQL $major: no sample in $samples matches $pattern"
  done < <(grep -v -e '^#' -e '^$' "$list")
done
if [ -n "$failed" ]; then
  echo "leak_sentinel_test: FAILED:$failed"
  exit 1
fi
echo "leak_sentinel_test: each sample leak, assertion and crash line fails tests/leak_sentinel.sh;" \
  "the clean log passes (PostgreSQL$majors)"
