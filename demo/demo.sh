#!/usr/bin/env bash
# A message is delivered three times; the business effect happens once and the duplicates
# are reported.  Runs against $DATABASE_URL, or the throwaway cluster `make demo` opens.
set -euo pipefail
cd "$(dirname "$0")"
if [[ -n "${DATABASE_URL:-}" ]]; then
  psql() { command psql "$DATABASE_URL" "$@"; }
fi
psql -qX -v ON_ERROR_STOP=1 -f demo.sql
