#!/usr/bin/env bash
# The AWS end-to-end tests: the four Lambda functions hosted by `cargo lambda watch`, on moto
# (SQS, SES v2) and DynamoDB Local (tables), with the resources made from template.yaml.
# Installs cargo-lambda from PyPI (pinned) if missing, builds the function binaries (debug),
# then runs the tests under scripts/aws-test-services.sh, which starts moto and DynamoDB Local
# and sets HOOKWISE_TEST_REQUIRE_AWS=1: a missing service or cargo-lambda fails the run.
#
# `sam build` (release, arm64, through cargo-lambda and zig) is not run here: it rebuilds the
# whole dependency tree with LTO four times, far longer than these tests. docs/aws.md has it.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_LAMBDA_VERSION="${CARGO_LAMBDA_VERSION:-1.9.2}"
if ! cargo lambda --version 2>/dev/null | grep -q "cargo-lambda $CARGO_LAMBDA_VERSION"; then
  echo "aws-e2e: installing cargo-lambda==$CARGO_LAMBDA_VERSION from PyPI" >&2
  python3 -m pip install --quiet --disable-pip-version-check "cargo-lambda==$CARGO_LAMBDA_VERSION"
  hash -r
fi
cargo lambda --version

cargo build --locked --bins -p hookwise-ingest -p hookwise-deliver -p hookwise-scheduler -p hookwise-dead-letter
scripts/aws-test-services.sh run -- \
  cargo test --locked -p hookwise-tests --test aws_e2e --test aws_iam -- --nocapture
