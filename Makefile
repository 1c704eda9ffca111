# The newcomer's contract: `make demo` and `make test` do all the set-up on a fresh
# Debian 12 machine (as root), and skip in seconds whatever is already done.

# The system's PostgreSQL, from Debian's packages: install, demo, regress, pgrx-test, lint.
SYSTEM_MAJOR  ?= 15
PG_CONFIG     ?= /usr/lib/postgresql/$(SYSTEM_MAJOR)/bin/pg_config
# The server `make bench` measures: the system's, or 18, built from source beside it
# (tools/pg-build.sh 18, into PG18_PREFIX) since Debian 12 has no package of it.
PG_MAJOR      ?= $(SYSTEM_MAJOR)
PG18_PREFIX   := $(shell bash tools/pg-build.sh --prefix 18)
PGRX_VERSION  := 0.18.1
CARGO_FUZZ_VERSION := 0.13.2
PGXS_TEST     = $(shell $(PG_CONFIG) --pkglibdir 2>/dev/null)/pgxs/src/test
APT_PACKAGES  := postgresql-$(SYSTEM_MAJOR) postgresql-server-dev-$(SYSTEM_MAJOR) postgresql-$(SYSTEM_MAJOR)-cron postgresql-$(SYSTEM_MAJOR)-pgaudit \
                 postgresql-contrib libclang-dev sudo pkg-config \
                 golang-go golang-github-jackc-pgx-v4-dev golang-github-rabbitmq-amqp091-go-dev \
                 python3-matplotlib libpostgresql-jdbc-java librabbitmq-client-java libslf4j-java
# A throwaway cluster with pg_cron preloaded; everything that needs a server runs inside it.
VIRTUALENV    := pg_virtualenv -v $(SYSTEM_MAJOR) -o shared_preload_libraries=pg_cron,pgaudit,pg_stat_statements -o cron.use_background_workers=on
REGRESS_TESTS := $(sort $(basename $(notdir $(wildcard pg_test/sql/*.sql))))
ISOLATION_TESTS := $(sort $(basename $(notdir $(wildcard pg_test/isolation/specs/*.spec))))
PGRX_TEST_DIR ?= /tmp/idempotency-pgrx-test
CASSERT_MAJOR ?= 15

.PHONY: all deps apt-deps cargo-pgrx cargo-fuzz pgrx-init install demo e2e test regress pgrx-test core-test fuzz-short test-cassert test-pg18 pg18 lint bench bench-scale bench-instructions soak fuzz fuzz-direct clean

all: install

# --- set-up ----------------------------------------------------------------------------
# Each step checks the machine itself rather than a stamp file, so a clone carried to a
# new machine still installs what that machine lacks; on a ready machine they take seconds.
deps: apt-deps cargo-pgrx pgrx-init

apt-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "Installing with apt: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

cargo-pgrx:
	@if ! cargo pgrx --version 2>/dev/null | grep -q ' $(PGRX_VERSION)$$'; then \
	  cargo install cargo-pgrx --version $(PGRX_VERSION) --locked; \
	fi

# libFuzzer's driver for fuzz/ (about two minutes to build); it works on the stable toolchain
# with --sanitizer none.
cargo-fuzz:
	@if ! cargo fuzz --version 2>/dev/null | grep -q ' $(CARGO_FUZZ_VERSION)$$'; then \
	  cargo install cargo-fuzz --version $(CARGO_FUZZ_VERSION) --locked; \
	fi

# pgrx only needs to know the system pg_config, and 18's once it is built (`make pg18`);
# it must never download PostgreSQL. `cargo pgrx init` adds to the configuration it finds.
pgrx-init: apt-deps cargo-pgrx
	@if ! grep -qs '^pg$(SYSTEM_MAJOR) *= *"$(PG_CONFIG)"' $${PGRX_HOME:-$$HOME/.pgrx}/config.toml; then \
	  cargo pgrx init --pg$(SYSTEM_MAJOR) $(PG_CONFIG); \
	fi
	@if [ -x $(PG18_PREFIX)/bin/pg_config ] && \
	    ! grep -qs '^pg18 *= *"$(PG18_PREFIX)/bin/pg_config"' $${PGRX_HOME:-$$HOME/.pgrx}/config.toml; then \
	  cargo pgrx init --pg18 $(PG18_PREFIX)/bin/pg_config; \
	fi

# PostgreSQL 18 with amcheck, pg_stat_statements, auto_explain and pgaudit, from sid's source
# packages, once per machine (about three and a half minutes on two cores).
pg18:
	bash tools/pg-build.sh 18
	@$(MAKE) -s pgrx-init

# --- build and install -----------------------------------------------------------------
install: deps
	bash tools/pgrx-install.sh $(PG_CONFIG)

# --- the demo --------------------------------------------------------------------------
demo: install
	@if [ -n "$$DATABASE_URL" ]; then bash demo/demo.sh; else $(VIRTUALENV) bash demo/demo.sh; fi

# Every source of duplicates injected for real (a producer's retry, a kill between COMMIT and
# ack, an ack deadline, a DLQ replay, a backfill, a consumer killed among three) against the
# machine's RabbitMQ and NATS, with the examples/ consumers of every language; prints one row per
# run and fails on any effect lost or doubled (tests/e2e.sh). .ci/run runs it.
e2e: install
	$(VIRTUALENV) -o ssl=off bash tests/e2e.sh

# --- lint ------------------------------------------------------------------------------
# Clippy and rustfmt (rustfmt.toml: the code's 120 columns) must stay silent on every crate
# of the workspace and on the extension built for 18, whose code src/postgres/version.rs
# switches; no released SQL script may change (RELEASES, sql/released/). pgrx-pg-sys needs
# pg_config to generate its bindings, hence deps and pg18. Two checks that need no server:
# README's SQLSTATE table against the raise sites, and the leak sentinel against sample logs.
lint: deps pg18
	cargo fmt --all --check
	cargo fmt --manifest-path fuzz/Cargo.toml --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings
	cargo clippy -p idempotency --no-default-features --features pg18 --all-targets -- -D warnings
	bash tools/check-released.sh
	@test -z "$$(gofmt -l examples/go)" || { echo "gofmt would change: $$(gofmt -l examples/go)"; exit 1; }
	env PG_CONFIG=$(PG_CONFIG) bash tests/sqlstate_table.sh
	bash tests/leak_sentinel_test.sh

# --- tests -----------------------------------------------------------------------------
# pgrx-test installs its own debug build system-wide, so it runs first and `regress`
# reinstalls the release build. test-pg18 touches only its own prefix.
test: core-test fuzz-short pgrx-test regress test-pg18

# The pgrx-free core (core/): its unit tests and its properties (proptest) at their default
# case count; `make fuzz` runs them at a hundred times that.
core-test:
	cargo test --release -p idempotency-core

# Each in-process fuzz target of fuzz/ for FUZZ_SECONDS (10 here; `make fuzz` runs them longer).
fuzz-short: cargo-fuzz
	env FUZZ_SECONDS=$${FUZZ_SECONDS:-10} bash tests/fuzz.sh

# pg_regress over pg_test/ and the client-driven tests, against one throwaway cluster. On a
# failure pg_virtualenv prints its server log last, so last-words.sh repeats the failure below.
regress: install
	$(VIRTUALENV) env PGXS_TEST="$(PGXS_TEST)" REGRESS_TESTS="$(REGRESS_TESTS)" \
	  ISOLATION_TESTS="$(ISOLATION_TESTS)" bash tests/run-in-cluster.sh 2>&1 | tee target/suites.out
	bash tests/last-words.sh target/suites.out

# #[pg_test] functions run inside a cluster that cargo-pgrx starts as the postgres user.
pgrx-test: deps
	rm -rf $(PGRX_TEST_DIR)
	cargo pgrx test pg$(SYSTEM_MAJOR) --runas postgres --pgdata $(PGRX_TEST_DIR)

# The same server-side suites against an assert-enabled PostgreSQL, which stops a backend
# with TRAP on misuse of buffer, snapshot and executor APIs that a release build forgives.
# tests/own-server.sh builds that server once per machine (tools/pg-build.sh, about six
# minutes on two cores), installs the extension there with its own pgrx configuration and
# target directory, and fails on any TRAP, crashed process or leak warning in the server log
# (tests/leak_sentinel.sh, which reads regress's server log too). pg_cron is not built for it.
# CASSERT_MAJOR=18 does the same on 18 (tools/pg-build.sh 18-cassert).
test-cassert: deps
	env REGRESS_TESTS="$(REGRESS_TESTS)" ISOLATION_TESTS="$(ISOLATION_TESTS)" bash tests/own-server.sh $(CASSERT_MAJOR)-cassert

# The same suites against PostgreSQL 18 (see pg18), #[pg_test] functions first: like
# pgrx-test they install a debug build, into 18's prefix, which own-server.sh then replaces.
# Their own target directory keeps pg18's pgrx-pg-sys from rebuilding pg15's in target/.
test-pg18: deps pg18
	rm -rf $(PGRX_TEST_DIR)-18
	env CARGO_TARGET_DIR=$(CURDIR)/target/pg18 cargo pgrx test pg18 --runas postgres --pgdata $(PGRX_TEST_DIR)-18
	env REGRESS_TESTS="$(REGRESS_TESTS)" ISOLATION_TESTS="$(ISOLATION_TESTS)" bash tests/own-server.sh 18

ifeq ($(PG_MAJOR),$(SYSTEM_MAJOR))
# fsync on, as on a real server and in 18's cluster below: pg_virtualenv turns it off, and the
# consumer run's synchronous commits would then wait for no flush.
bench: install
	@if [ -n "$$DATABASE_URL" ]; then bash bench/run.sh; else $(VIRTUALENV) -o synchronous_commit=off -o autovacuum=off -o ssl=off -o fsync=on bash bench/run.sh; fi
	/usr/bin/python3 bench/report.py

# The ledger at 1 M, 30 M and 100 M retained keys beside a hand-written table (bench/scale.sh;
# SCALE_SIZES and the other SCALE_* settings choose less). The cluster keeps PostgreSQL's
# default settings but synchronous_commit; 100 M keys need about 50 GB of free disk.
bench-scale: install
	$(VIRTUALENV) -o synchronous_commit=off -o ssl=off bash bench/scale.sh
else
# Against a server of our own, started with initdb and pg_ctl (pg_virtualenv knows only
# packaged servers); the extension is built and installed into its prefix on the way. It is
# reached over TCP to localhost without TLS, as pg_virtualenv's is with ssl=off above, so
# that the versions compare: TLS adds a fixed cost per transaction that narrows every ratio.
bench: deps
	env SERVER_OPTIONS="-c synchronous_commit=off -c autovacuum=off -c listen_addresses=localhost" \
	  bash tests/own-server.sh $(PG_MAJOR) env PGHOST=localhost bash bench/run.sh
	/usr/bin/python3 bench/report.py
endif

# Claims, versioned updates, outbox sends and relays on 8 connections and the purge every 5 s
# for 30 minutes; fails if a backend's memory contexts grow by more than 5 % after a 2-minute
# warm-up (bench/soak.sh; SOAK_SECONDS, SOAK_WARMUP). make test runs a 2-minute form.
soak: install
	$(VIRTUALENV) -o ssl=off bash bench/soak.sh

# The long forms of what fuzz-short, core-test and the in-server property test run in make test:
# each fuzz target for FUZZ_SECONDS (120), the core's properties at 25,600 cases, and the jsonb
# reader against jsonb_each on 20,000 random objects (RUST_PROPERTY_CASES) in a cluster that
# cargo-pgrx starts. Prints executions, time and findings per target.
fuzz: cargo-fuzz deps
	env FUZZ_SECONDS=$${FUZZ_SECONDS:-120} bash tests/fuzz.sh
	env PROPTEST_CASES=$${PROPTEST_CASES:-25600} cargo test --release -p idempotency-core
	rm -rf $(PGRX_TEST_DIR)-fuzz
	env RUST_PROPERTY_CASES=$${RUST_PROPERTY_CASES:-20000} \
	  cargo pgrx test pg$(SYSTEM_MAJOR) random_objects_read_as_jsonb_each_reads_them --runas postgres --pgdata $(PGRX_TEST_DIR)-fuzz

# The differential tester (tests/differential) for ten minutes from a random seed, which it
# prints first, so that a failing case replays with --seed S --case I.
fuzz-direct: install
	$(VIRTUALENV) cargo run -q --release -p idempotency-differential -- --seconds 600

# callgrind's instruction counts per transaction, steadier than any tps (bench/instructions.sh).
bench-instructions: install
	@dpkg-query -W -f='$${Status}' valgrind 2>/dev/null | grep -q 'ok installed' || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind; }
	bash bench/instructions.sh

clean:
	cargo clean
	rm -rf results
