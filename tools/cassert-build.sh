#!/usr/bin/env bash
# Builds an assert-enabled PostgreSQL 15 (with amcheck, pg_stat_statements, auto_explain
# and pgaudit) from Debian's source packages, once per machine: misuse of buffer,
# snapshot and executor APIs that a release build forgives fails loudly there.
# The result lives in $CASSERT_PREFIX and is reused while its stamp file exists.
set -euo pipefail
PREFIX=${CASSERT_PREFIX:-/var/cache/idempotency/pg15-cassert}
WORK=${CASSERT_WORK:-/var/cache/idempotency/src}
PG_VERSION=${CASSERT_PG_VERSION:-15.18-0+deb12u1}
# "upstream-layout": earlier builds applied Debian's patches and so installed their modules
# into the system's /usr/lib/postgresql/15/lib; their stamp must not count any more.
STAMP=$PREFIX/.built-$PG_VERSION-upstream-layout
[ -f "$STAMP" ] && { echo "cassert PostgreSQL already built in $PREFIX"; exit 0; }
# Run from `make test-cassert`, the outer make's MAKELEVEL would tell PostgreSQL's makefiles
# they are a sub-make, and they generate their headers (utils/errcodes.h, ...) only at level 0.
unset MAKELEVEL MAKEFLAGS MFLAGS

need=(); for p in bison flex libicu-dev libreadline-dev zlib1g-dev libssl-dev pkg-config dpkg-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; fi

# A private apt configuration that knows bookworm's source packages, leaving the machine's
# own sources alone: only source packages are fetched this way, never binaries.
APT=$WORK/apt; mkdir -p "$APT/lists/partial" "$APT/archives/partial"
# Only source packages are fetched this way, never binaries. pg-cron's sources answer 404
# in both bookworm and sid here, so the cassert build has no pg_cron (the release build's
# suite covers the scheduled purge).
echo "deb-src http://deb.debian.org/debian bookworm main" > "$APT/sources.list"
apt_src=(-o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
         -o Dir::State::Lists="$APT/lists" -o Dir::Cache::Archives="$APT/archives")
apt-get "${apt_src[@]}" update -qq
cd "$WORK"
apt-get "${apt_src[@]}" source --download-only "postgresql-15=$PG_VERSION"
apt-get "${apt_src[@]}" source --download-only --tar-only pgaudit-1.7
rm -rf build && mkdir build && cd build
# Upstream sources only: Debian's patches hardcode the system's paths whatever the prefix
# (50-per-version-dirs sets pkglibdir to /usr/lib/postgresql/15/lib, 51-default-sockets-in-var
# the socket directory to /var/run/postgresql), so `make install` would overwrite the system
# server's plpgsql.so, contrib modules and pgxs, and clients would reach the system cluster.
dpkg-source --skip-patches -x ../postgresql-15_*.dsc >/dev/null
# pgaudit's upstream sources are all it needs (its Debian diff answers 404 here).
tar xf ../pgaudit-1.7_*.orig.tar.*

cd postgresql-15-*/
./configure --prefix="$PREFIX" --enable-cassert --enable-debug --with-icu --with-openssl CFLAGS="-O1 -g" >/dev/null
make -s -j"$(nproc)" >/dev/null
# Refuse to install anything outside the prefix (see --skip-patches above).
for dir in PKGLIBDIR PGSHAREDIR DEFAULT_PGSOCKET_DIR; do
  grep -Eq "define $dir +\"($PREFIX/|/tmp\")" src/port/pg_config_paths.h src/include/pg_config_manual.h ||
    { echo "cassert build: $dir is not under $PREFIX:"; grep -h "define $dir" src/port/pg_config_paths.h src/include/pg_config_manual.h; exit 1; }
done
rm -rf "$PREFIX"
make -s install >/dev/null
# pg_regress comes with `make install`; the isolation tester is installed apart.
make -s -C src/test/isolation install >/dev/null
for m in amcheck pg_stat_statements auto_explain; do make -s -C contrib/$m install >/dev/null; done
cd ..
for ext in pgaudit-*/; do make -s -C "$ext" USE_PGXS=1 PG_CONFIG="$PREFIX/bin/pg_config" install >/dev/null; done
touch "$STAMP"
echo "cassert PostgreSQL built in $PREFIX"
