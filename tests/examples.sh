#!/usr/bin/env bash
# Sourced by tests/readme_snippets.sh and tests/e2e.sh, from the repository's root: builds each
# examples/ consumer on first use and sets the command that runs it. Each command reads the
# libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) and QUEUE from its environment,
# whatever the driver wants them as.
#   examples_python: examples/python/.venv with the pinned requirements; sets $venv
#   examples_node:   examples/node/node_modules from package-lock.json (npm ci)
#   examples_rust:   cargo build of examples/rust;                          sets $RUST_CONSUMER
#   examples_go:     go build, GOPATH mode, Debian's Go packages;           sets $GO_CONSUMER
#   examples_java:   javac against Debian's pgjdbc and RabbitMQ client;     sets $JAVA_CONSUMER
examples_python() { source tests/python-venv.sh; }

examples_node() {
  if ! cmp -s examples/node/package-lock.json examples/node/node_modules/.package-lock.json.installed 2>/dev/null; then
    echo "examples: npm ci in examples/node"
    (cd examples/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    cp examples/node/package-lock.json examples/node/node_modules/.package-lock.json.installed
  fi
  export NODE_PATH=$PWD/examples/node/node_modules  # for a consumer file outside examples/node
}

examples_rust() {
  echo "examples: cargo build in examples/rust"
  cargo build -q --manifest-path examples/rust/Cargo.toml --target-dir examples/rust/target
  RUST_CONSUMER='DATABASE_URL="$(tests/conninfo.py libpq)" exec examples/rust/target/debug/idempotency-example-rust'
}

examples_go() {
  [ -d /usr/share/gocode/src/github.com/jackc/pgx/v4 ] && command -v go >/dev/null || {
    echo "examples: no Go toolchain or pgx v4 here (make deps installs golang-go and Debian's Go packages)" >&2
    return 1
  }
  echo "examples: go build in examples/go (GOPATH mode, Debian's packages)"
  (cd examples/go && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=$PWD/../../target/gocache \
    go build -o ../../target/go-example .)
  GO_CONSUMER='exec target/go-example'
}

examples_java() {
  command -v javac >/dev/null && [ -f /usr/share/java/postgresql.jar ] && [ -f /usr/share/java/amqp-client.jar ] || {
    echo "examples: no javac, or no Debian JDBC driver or RabbitMQ client here (make deps installs them)" >&2
    return 1
  }
  echo "examples: javac examples/java (Debian's pgjdbc and RabbitMQ client)"
  rm -rf target/java-example
  javac -d target/java-example -cp /usr/share/java/postgresql.jar:/usr/share/java/amqp-client.jar \
    examples/java/src/main/java/example/Consumer.java
  export JAVA_CLASSPATH=target/java-example:/usr/share/java/postgresql.jar:/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-nop.jar
  # JDBC has no libpq variables and no Unix sockets: the same server over TCP to localhost.
  JAVA_CONSUMER='JDBC_URL="$(tests/conninfo.py jdbc)" exec java -cp "$JAVA_CLASSPATH" example.Consumer'
}
