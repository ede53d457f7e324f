#!/usr/bin/env bash
# The cost meter (issue 12 point 6; not a timed test): the pipeline on DynamoDB Local and
# moto with every AWS request and capacity unit counted, per event, for four profiles
# (realistic, three subscriptions, a failed attempt and its retry, batch ingest of 100),
# priced per million events. docs/aws.md explains the figures.
# Usage: scripts/bench-cost.sh            (from the repository root or anywhere in it)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
exec scripts/aws-test-services.sh run -- \
  cargo test --workspace --locked --test cost -- --nocapture --test-threads 1
