#!/usr/bin/env bash
# Delivery latency under a steady open-loop load (tests/benches/latency.rs): `hookwise dev`
# on SQLite, then `hookwise dev --aws` with its tables on DynamoDB Local and its queues on
# LocalStack's SQS and then on moto's, which scripts/aws-test-services.sh and
# scripts/localstack.sh install and start. Not part of the test suite.
# HOOKWISE_BENCH_JSON=FILE also writes the figures there; HOOKWISE_LATENCY_* set the rates
# and the length (see the bench's header).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p hookwise-cli
HOOKWISE_BIN="$PWD/target/release/hookwise" scripts/aws-test-services.sh run -- scripts/localstack.sh run -- \
  cargo bench --quiet --locked --profile profiling -p hookwise-tests --bench latency
