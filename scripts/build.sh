#!/usr/bin/env bash
# The one build the test command and `make dev` share: the whole workspace, every target.
# The same command means the same feature resolution, so either one after the other
# compiles nothing. Prints the target directory (cargo's own output goes to stderr).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --all-targets --locked >&2
echo "${CARGO_TARGET_DIR:-$PWD/target}"
