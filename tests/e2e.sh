#!/usr/bin/env bash
# make e2e: builds every examples/ consumer (tests/examples.sh) and runs tests/e2e/e2e.py, which
# injects each source of duplicates for real against the machine's RabbitMQ and NATS JetStream
# and checks the payments: every effect exactly once, none lost. Runs in the cluster the libpq
# variables point at, with the extension installed; E2E_PLAN chooses source:consumer pairs.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/examples.sh
examples_python
examples_node
examples_rust
examples_go
examples_java
export E2E_CMD_python="exec $venv/bin/python examples/python/consumer.py"
export E2E_CMD_python_nats="exec $venv/bin/python examples/python/nats_consumer.py"
export E2E_CMD_node="exec node examples/node/consumer.js"
export E2E_CMD_rust=$RUST_CONSUMER E2E_CMD_go=$GO_CONSUMER E2E_CMD_java=$JAVA_CONSUMER
rm -rf target/e2e
exec "$venv/bin/python" tests/e2e/e2e.py
