#!/usr/bin/env bash
# Installs the extension into the server of PG_CONFIG (the first argument) with cargo pgrx.
# The old library is removed first: cargo pgrx copies over it in place, and a running backend
# that has it mapped then executes the new file's bytes at the old one's addresses and dies
# (SIGILL or SIGBUS), taking the server through crash recovery. Removed, it stays whole for
# those backends until they exit, as PostgreSQL's own `make install` leaves it.
set -euo pipefail
PG_CONFIG=${1:?usage: tools/pgrx-install.sh PG_CONFIG}
rm -f "$("$PG_CONFIG" --pkglibdir)/idempotency.so"
exec cargo pgrx install --release --pg-config "$PG_CONFIG"
