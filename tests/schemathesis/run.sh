#!/usr/bin/env bash
# schemathesis against a running `hookwise dev`: it reads /v1/openapi.json from the server
# and checks every response (no 5xx, status codes, content types, headers and bodies as
# documented, invalid input refused, valid input accepted, auth enforced).
# Bounded: a fixed seed and a fixed number of examples per operation.
#
#   HOOKWISE_BIN   the hookwise binary (default: target/debug/hookwise)
#   ARTIFACTS_DIR  where the JUnit report goes (default: tests/artifacts)
#
# Run it where no delivery can leave the machine: schemathesis creates subscriptions to
# made-up URLs, and `hookwise dev` tries to deliver to them (scripts/ui-tests.sh runs it
# in a network namespace of its own, with loopback only).
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${HOOKWISE_BIN:-target/debug/hookwise}
ARTIFACTS=${ARTIFACTS_DIR:-tests/artifacts}
mkdir -p "$ARTIFACTS"
data=$(mktemp -d -t hookwise-schemathesis-XXXXXX)
out="$data/stdout"
# An operator key, so the operator routes are exercised too; it acts for the dev tenant
# through the Hookwise-Tenant header (its own routes' tenant-key path is what every other
# suite uses).
operator=$("$BIN" operator create-key --data-dir "$data" | sed -n 's/.*"api_key":"\([^"]*\)".*/\1/p')
[ -n "$operator" ] || { echo "hookwise operator create-key printed no key" >&2; exit 1; }
# --reveal-secrets: reveal-secret's 200 is checked against its schema too, not only its 403.
HOOKWISE_LOG=warn "$BIN" dev --listen 127.0.0.1:0 --data-dir "$data" --scheduler-interval 1 --reveal-secrets >"$out" 2>"$data/stderr" &
dev=$!
trap 'kill "$dev" 2>/dev/null; wait "$dev" 2>/dev/null; rm -rf "$data"' EXIT

for _ in $(seq 1 300); do
  grep -q '^API key:' "$out" 2>/dev/null && break
  kill -0 "$dev" 2>/dev/null || { cat "$data/stderr" >&2; echo "hookwise dev exited" >&2; exit 1; }
  sleep 0.1
done
base=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$out")
tenant=$(sed -n 's/^tenant: *//p' "$out")
[ -n "$base" ] && [ -n "$tenant" ] || { echo "hookwise dev did not print its address and tenant" >&2; exit 1; }

schemathesis --config-file tests/schemathesis/schemathesis.toml run "$base/v1/openapi.json" --checks all \
  --header "Authorization: Bearer $operator" --header "Hookwise-Tenant: $tenant" \
  --report junit --report-junit-path "$ARTIFACTS/schemathesis-junit.xml" \
  "$@"
