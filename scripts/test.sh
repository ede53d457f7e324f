#!/usr/bin/env bash
# The whole test suite. Installs what the tests need (from the package registries), starts
# the services they talk to on 127.0.0.1, runs every test, and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s  [%s, %ss in]\n' "$*" "$(date +%T)" "$SECONDS"; }

step "Python test tools"
python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
hash -r

step "Format"
cargo fmt --all -- --check

step "Build (once, for every test below and for make dev)"
HOOKWISE="$(scripts/build.sh)/debug/hookwise"

step "Clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

# The end-to-end tests run these binaries rather than building `-p hookwise-cli` on their own
# (a build of one package resolves features differently and would compile the AWS SDK again).
export HOOKWISE_BIN="$HOOKWISE"
export HOOKWISE_LAMBDA_BIN_DIR="$(dirname "$HOOKWISE")"

step "Template lint: cfn-lint, its serverless rules, and sam validate --lint"
scripts/lint-template.sh

step "sam build of the four functions for arm64 with cargo-lambda (the release build sam deploy ships)"
scripts/sam-build.sh

step "qemu-user and the aarch64 C library, to run the arm64 artifacts just built"
sysroot="$(scripts/qemu-arm64.sh)"  # (apart from the export, so a failure stops the run)
export HOOKWISE_TEST_ARM64_SYSROOT="$sysroot"
export HOOKWISE_TEST_ARM64_BUILD="$PWD/.aws-sam/build"

step "Rust tests (the arm64 artifacts among them, under qemu), then the chaos suite and the retry storm end to end with their figures, with moto, DynamoDB Local and LocalStack's SQS running"
scripts/aws-test-services.sh run -- scripts/localstack.sh run -- bash -c '
  cargo test --workspace --locked -- --skip chaos_ --skip storm_e2e_ &&
  cargo test --workspace --locked --test chaos -- --nocapture &&
  cargo test --workspace --locked --test storm_e2e -- --nocapture'

step "sam local: the four functions in Docker (an image built offline), invoke and start-api, on moto and DynamoDB Local"
scripts/aws-test-services.sh run -- scripts/sam-local.sh test

step "Dashboard in headless Chromium, and the API against its OpenAPI document (schemathesis)"
scripts/ui-tests.sh

step "Retry-storm gate on the deployed policy"
"$HOOKWISE" storm --config infra/storm/standard.yaml

step "All tests passed"
