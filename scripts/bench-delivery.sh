#!/usr/bin/env bash
# Delivery throughput of `hookwise dev` (release build) against a bare reqwest POST loop,
# side by side in one run, events one per request and then 100 per request, with the
# process's memory idle and at its peak. Not part of the test suite: these machines are
# shared and noisy. HOOKWISE_BENCH_JSON=FILE also writes the figures there.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p hookwise-cli
# The harness (client and receiver) in the quick-to-build optimised profile; only the binary
# under test needs the release profile.
HOOKWISE_BIN="$PWD/target/release/hookwise" cargo bench --quiet --locked --profile profiling -p hookwise-tests --bench delivery
