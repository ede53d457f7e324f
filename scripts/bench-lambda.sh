#!/usr/bin/env bash
# Start-up time, peak RSS and size of the four Lambda functions' release binaries against a
# minimal lambda_runtime hello world (tests/lambda-hello) built with the same profile, side by
# side in one run: builds them, then runs scripts/bench-lambda.py (see its docstring), which
# starts each against an emulated Runtime API on 127.0.0.1. Goal: each function within 1.5x of
# the hello world's start-up and RSS. Not part of the test suite: these machines are shared
# and noisy.
#
#   scripts/bench-lambda.sh                      release build (fat LTO: slow on 2 cores), 15 rounds
#   scripts/bench-lambda.sh --runs 5 --json f    any of bench-lambda.py's flags
#
# For quick iterations, build with `--profile profiling` and run
# `scripts/bench-lambda.py --bin-dir target/profiling` directly.
set -euo pipefail
cd "$(dirname "$0")/.."
# The functions on their own, as `sam build` builds them (with the CLI, cargo would unify
# features and give them the CLI's provisioning code).
cargo build --release --locked --quiet \
  -p hookwise-ingest -p hookwise-deliver -p hookwise-scheduler -p hookwise-dead-letter -p lambda-hello
exec python3 scripts/bench-lambda.py --bin-dir target/release "$@"
