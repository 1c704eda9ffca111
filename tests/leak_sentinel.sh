#!/usr/bin/env bash
# Fails on what the suites' clients never see in a server log: a resource a backend leaked
# (PostgreSQL only warns at commit, then releases it itself), a failed assertion, a crashed
# process. PostgreSQL words these differently by major (17 gave resource owners one text for
# every kind), so tests/leak-patterns/MAJOR lists each major's, with their sources.
# Usage: tests/leak_sentinel.sh LOGFILE MAJOR   prints the lines it finds, in context
set -euo pipefail
usage="usage: tests/leak_sentinel.sh LOGFILE MAJOR"
log=${1:?$usage} major=${2:?$usage}
list=$(dirname "$0")/leak-patterns/$major
[ -f "$list" ] || { echo "leak_sentinel: no pattern list for PostgreSQL $major ($list)"; exit 2; }
patterns=$(grep -v -e '^#' -e '^$' "$list")
# grep exits 1 for no line found, 2 for an unreadable log or a bad pattern: only 1 is clean.
status=0
found=$(grep -c -E -e "$patterns" "$log") || status=$?
case $status in
  1) echo "leak_sentinel: $log: no leaked resource, failed assertion or crashed process (PostgreSQL $major)" ;;
  0) echo "leak_sentinel: $log: $found line(s) of a leaked resource, failed assertion or crashed process ($list):"
     grep -n -E -B2 -A10 -e "$patterns" "$log" | head -200
     exit 1 ;;
  *) exit 2 ;;
esac
