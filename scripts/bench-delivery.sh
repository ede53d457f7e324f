#!/usr/bin/env bash
# Delivery throughput of `hookwise dev` (release build) against a bare reqwest POST loop,
# side by side in one run. Not part of the test suite: these machines are shared and noisy.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p hookwise-cli
HOOKWISE_BIN="$PWD/target/release/hookwise" cargo bench --quiet -p hookwise-tests --bench delivery
