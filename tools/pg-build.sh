#!/usr/bin/env bash
# Builds a PostgreSQL of our own from Debian's source packages, once per machine, into a
# prefix that nothing else uses, with amcheck, pg_stat_statements, auto_explain, pgaudit and
# (where its sources can be fetched) pg_cron. The result is reused while its stamp exists.
#
#   tools/pg-build.sh BUILD            build BUILD unless its stamp says it is there
#   tools/pg-build.sh --prefix BUILD   print BUILD's prefix (tests/own-server.sh asks)
#   tools/pg-build.sh --has-cron BUILD exit 0 if BUILD has pg_cron installed
#
# BUILD is one of:
#   15-cassert  bookworm's PostgreSQL 15 with assertions: misuse of buffer, snapshot and
#               executor APIs that a release build forgives fails loudly there.
#   18          sid's PostgreSQL 18, a release build: the newest server the extension targets,
#               beside the system's 15 (Debian 12 has no binary package of 18).
#   18-cassert  the same with assertions.
set -euo pipefail

mode=build
case ${1:-} in --prefix|--has-cron) mode=${1#--}; shift ;; esac
BUILD=${1:?usage: tools/pg-build.sh [--prefix|--has-cron] 15-cassert|18|18-cassert}
ROOT=/var/cache/idempotency

# One table of what differs between the builds; the steps below are shared. The 15-cassert
# paths, version and stamp are those of the former tools/cassert-build.sh, so machines that
# built it keep their cache (CASSERT_* overrides still apply).
case $BUILD in
  15-cassert)
    PREFIX=${CASSERT_PREFIX:-$ROOT/pg15-cassert}
    WORK=${CASSERT_WORK:-$ROOT/src}
    PG_VERSION=${CASSERT_PG_VERSION:-15.18-0+deb12u1}
    SUITE=bookworm MAJOR=15
    PGAUDIT=pgaudit-1.7
    # pg-cron's sources answered 404 in both bookworm and sid when this build was made, so it
    # has no pg_cron (the release build's suite covers the scheduled purge).
    PGCRON=""
    CONFIGURE=(--enable-cassert --enable-debug CFLAGS="-O1 -g")
    ;;
  18)
    PREFIX=${PG18_PREFIX:-$ROOT/pg18}
    WORK=${PG18_WORK:-$ROOT/src-pg18}
    # sid moves on: when this version leaves the archive, raise it (the stamp follows it).
    PG_VERSION=${PG18_PG_VERSION:-18.6-3}
    SUITE=sid MAJOR=18
    PGAUDIT=pgaudit-18
    PGCRON=pg-cron
    # 18 makes liburing and libnuma opt-in, so a plain release build needs neither.
    CONFIGURE=()
    ;;
  # 18 with assertions: the executor calls src/postgres/version.rs makes for 16 and up
  # (RTEPermissionInfo, unpruned relids, ri_needLockTagTuple) checked as 15-cassert checks 15's.
  18-cassert)
    PREFIX=${PG18_CASSERT_PREFIX:-$ROOT/pg18-cassert}
    WORK=${PG18_CASSERT_WORK:-$ROOT/src-pg18-cassert}
    PG_VERSION=${PG18_PG_VERSION:-18.6-3}
    SUITE=sid MAJOR=18
    PGAUDIT=pgaudit-18
    PGCRON=pg-cron
    CONFIGURE=(--enable-cassert --enable-debug CFLAGS="-O1 -g")
    ;;
  *) echo "pg-build: unknown build '$BUILD' (15-cassert, 18 or 18-cassert)" >&2; exit 2 ;;
esac
# "upstream-layout": earlier builds applied Debian's patches and so installed their modules
# into the system's /usr/lib/postgresql/15/lib; their stamp must not count any more.
STAMP=$PREFIX/.built-$PG_VERSION-upstream-layout

case $mode in
  prefix) echo "$PREFIX"; exit 0 ;;
  has-cron) [ -f "$("$PREFIX/bin/pg_config" --pkglibdir 2>/dev/null)/pg_cron.so" ]; exit ;;
esac

[ -f "$STAMP" ] && { echo "PostgreSQL $BUILD already built in $PREFIX"; exit 0; }
# Run from make, the outer make's MAKELEVEL would tell PostgreSQL's makefiles they are a
# sub-make, and they generate their headers (utils/errcodes.h, ...) only at level 0.
unset MAKELEVEL MAKEFLAGS MFLAGS

need=(); for p in bison flex libicu-dev libreadline-dev zlib1g-dev libssl-dev pkg-config dpkg-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; fi

# A private apt configuration that knows the suite's source packages, leaving the machine's
# own sources alone: only source packages are fetched this way, never binaries.
APT=$WORK/apt; mkdir -p "$APT/lists/partial" "$APT/archives/partial"
echo "deb-src http://deb.debian.org/debian $SUITE main" > "$APT/sources.list"
apt_src=(-o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
         -o Dir::State::Lists="$APT/lists" -o Dir::Cache::Archives="$APT/archives")
apt-get "${apt_src[@]}" update -qq
cd "$WORK"
apt-get "${apt_src[@]}" source --download-only "postgresql-$MAJOR=$PG_VERSION"
apt-get "${apt_src[@]}" source --download-only --tar-only "$PGAUDIT"
if [ -n "$PGCRON" ] && ! apt-get "${apt_src[@]}" source --download-only --tar-only "$PGCRON"; then
  echo "pg-build: $PGCRON's sources could not be fetched from $SUITE; $BUILD has no pg_cron"
  PGCRON=""
fi
rm -rf build && mkdir build && cd build
# Upstream sources only: Debian's patches hardcode the system's paths whatever the prefix
# (50-per-version-dirs sets pkglibdir to /usr/lib/postgresql/NN/lib, 51-default-sockets-in-var
# the socket directory to /var/run/postgresql), so `make install` would overwrite the system
# server's plpgsql.so, contrib modules and pgxs, and clients would reach the system cluster.
dpkg-source --skip-patches -x ../postgresql-"$MAJOR"_*.dsc >/dev/null
# The extensions' upstream sources are all they need (pgaudit's Debian diff answered 404).
tar xf ../"$PGAUDIT"_*.orig.tar.*
[ -z "$PGCRON" ] || tar xf ../"$PGCRON"_*.orig.tar.*

cd postgresql-"$MAJOR"-*/
./configure --prefix="$PREFIX" --with-icu --with-openssl "${CONFIGURE[@]}" >/dev/null
make -s -j"$(nproc)" >/dev/null
# Refuse to install anything outside the prefix (see --skip-patches above).
for dir in PKGLIBDIR PGSHAREDIR DEFAULT_PGSOCKET_DIR; do
  grep -Eq "define $dir +\"($PREFIX/|/tmp\")" src/port/pg_config_paths.h src/include/pg_config_manual.h ||
    { echo "pg-build: $dir is not under $PREFIX:"; grep -h "define $dir" src/port/pg_config_paths.h src/include/pg_config_manual.h; exit 1; }
done
rm -rf "$PREFIX"
make -s install >/dev/null
# pg_regress comes with `make install`; the isolation tester is installed apart.
make -s -C src/test/isolation install >/dev/null
for m in amcheck pg_stat_statements auto_explain; do make -s -C contrib/$m install >/dev/null; done
cd ..
# Everything but the server's own tree: pgaudit, and pg_cron if fetched.
for ext in */; do
  [[ $ext == postgresql-* ]] && continue
  make -s -C "$ext" USE_PGXS=1 PG_CONFIG="$PREFIX/bin/pg_config" install >/dev/null
done
touch "$STAMP"
echo "PostgreSQL $BUILD built in $PREFIX"
