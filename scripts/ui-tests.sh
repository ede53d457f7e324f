#!/usr/bin/env bash
# The dashboard and OpenAPI tests, each against a real `hookwise dev`:
#   - tests/browser: the dashboard in headless Chromium (Debian's, driven by playwright-core);
#   - tests/schemathesis: schemathesis on /v1/openapi.json, every check on.
# Installs what they need (Debian's chromium and chromium-driver, the npm packages locked in
# tests/browser/package-lock.json, schemathesis pinned from PyPI), runs both, and leaves the
# screenshots and the schemathesis report in tests/artifacts/.
#
# Both run in a network namespace with loopback only: schemathesis creates subscriptions to
# made-up URLs, and nothing `hookwise dev` then tries to deliver may leave the machine.
# (HOOKWISE_UI_TESTS_NO_NETNS=1 runs without one, where `unshare --net` is not allowed.)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

step() { printf '\n==> %s\n' "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

step "Chromium and chromium-driver (Debian packages)"
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
fi
chromium --version

step "Browser test packages (npm ci, from package-lock.json)"
(cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)

step "schemathesis (PyPI, pinned)"
python3 -m pip install --quiet --disable-pip-version-check -r tests/schemathesis/requirements.txt
schemathesis --version

step "Build hookwise"
if [ -z "${HOOKWISE_BIN:-}" ]; then
  cargo build --quiet --locked -p hookwise-cli
  HOOKWISE_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/hookwise"
fi
export HOOKWISE_BIN
export ARTIFACTS_DIR="${ARTIFACTS_DIR:-$root/tests/artifacts}"
export CHROMIUM="${CHROMIUM:-$(command -v chromium)}"
mkdir -p "$ARTIFACTS_DIR"

# Run a command with loopback as the only network.
isolated() {
  if [ "${HOOKWISE_UI_TESTS_NO_NETNS:-}" = 1 ]; then
    "$@"
  else
    as_root unshare --net -- env "PATH=$PATH" HOME="$HOME" HOOKWISE_BIN="$HOOKWISE_BIN" \
      ARTIFACTS_DIR="$ARTIFACTS_DIR" CHROMIUM="$CHROMIUM" \
      bash -c 'ip link set lo up && exec "$@"' isolated "$@"
  fi
}

step "Dashboard in headless Chromium"
isolated bash -c 'cd tests/browser && node --test --test-reporter=spec dashboard.test.mjs portal.test.mjs'
echo "screenshots: $ARTIFACTS_DIR/dashboard.png, $ARTIFACTS_DIR/dashboard-phone.png, $ARTIFACTS_DIR/dashboard-stats.png, $ARTIFACTS_DIR/dashboard-stats-phone.png, $ARTIFACTS_DIR/portal.png, $ARTIFACTS_DIR/portal-embedded.png, $ARTIFACTS_DIR/portal-stats.png"

step "schemathesis against hookwise dev"
isolated tests/schemathesis/run.sh

step "UI tests passed"
