#!/usr/bin/env bash
# The cost meter (not a timed test): the pipeline on DynamoDB Local and moto with every AWS
# request and capacity unit counted, and what the tables store, per event, for six profiles
# (realistic, three subscriptions, a failed attempt and its retry, batch ingest of 100, and
# trickle traffic with and without a batching window), priced per million events.
# docs/aws.md explains the figures. HOOKWISE_BENCH_JSON=FILE also writes them there.
# Usage: scripts/bench-cost.sh            (from the repository root or anywhere in it)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
exec scripts/aws-test-services.sh run -- \
  cargo test --workspace --locked --test cost -- --nocapture --test-threads 1
