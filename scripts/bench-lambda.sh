#!/usr/bin/env bash
# Cold start of the four Lambda functions' release binaries, first invocation included,
# against two baselines built with the same profile in the same run: a bare lambda_runtime
# hello world (tests/lambda-hello) and a minimal function making one DynamoDB GetItem
# (tests/lambda-getitem). Builds them and the stage helper (tests/examples/bench_lambda_seed.rs:
# provisions template.yaml's tables on DynamoDB Local and its queues, SES and KMS on moto, and
# seeds one real first event per binary and round), starts the emulators
# (scripts/aws-test-services.sh), then runs scripts/bench-lambda.py (see its docstring): per
# binary, wall time from exec to the first invocation's response, CPU (user + sys) and peak
# RSS, warm and page-cache-cold. Goal (issue 34): each function's CPU within 1.3x of the
# GetItem function's. Not part of the test suite: these machines are shared and noisy.
#
#   scripts/bench-lambda.sh                      release build (fat LTO: slow on 2 cores), 15 rounds
#   scripts/bench-lambda.sh --runs 5 --json f    any of bench-lambda.py's flags
#   scripts/bench-lambda.sh --init-only          the older benchmark (exec to the first `next`, no emulators)
#
# For quick iterations, build with `--profile profiling` and run
# `scripts/aws-test-services.sh run -- scripts/bench-lambda.py --bin-dir target/profiling`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The functions on their own, as `sam build` builds them (with the CLI or the tests, cargo
# would unify features and give them the provisioning code).
cargo build --release --locked --quiet \
  -p hookwise-ingest -p hookwise-deliver -p hookwise-scheduler -p hookwise-dead-letter \
  -p lambda-hello -p lambda-getitem
case " $* " in
  *" --init-only "*) exec python3 scripts/bench-lambda.py --bin-dir target/release "$@" ;;
esac
# The stage helper (a debug build: it is not measured), in a cargo command of its own.
cargo build --locked --quiet -p hookwise-tests --example bench_lambda_seed
exec scripts/aws-test-services.sh run -- python3 scripts/bench-lambda.py --bin-dir target/release "$@"
