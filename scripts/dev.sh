#!/usr/bin/env bash
# `make dev`: the shared build (scripts/build.sh), then `hookwise dev` with the given flags.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(scripts/build.sh)"
exec "$target/debug/hookwise" dev "$@"
