#!/usr/bin/env bash
# last-words.sh OUTPUT: judges the output tests/run-in-cluster.sh wrote to OUTPUT. On a
# failure it repeats the failing suite's last lines (for pg_regress, the failing tests' names),
# to be printed below whatever came after them (pg_virtualenv's and own-server.sh's server
# logs), where a CI log that keeps only its tail still shows them; and exits 1.
set -uo pipefail
out=$1
if grep -q '^suites: [0-9]* passed, 0 failed' "$out"; then
  exit 0
fi
echo "== the failure, repeated from $out"
grep -B12 '^suites: FAILED' "$out" || tail -n 12 "$out"
exit 1
