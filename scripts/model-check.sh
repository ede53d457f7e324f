#!/usr/bin/env bash
# The model checker (hookwise-core's `model_check` test), run beside the test command's other
# steps: it takes a quarter of an hour on one core, and the release build for arm64 leaves a
# core idle while it links. It runs the binary `scripts/build.sh` built (a `cargo test` would
# wait for the build's lock on the target directory), at the lowest priority, so it takes
# only what the other steps leave.
#
#   scripts/model-check.sh start   start it in the background; its output goes to a log
#   scripts/model-check.sh wait    wait for it, print its output, and exit with its status
#   scripts/model-check.sh stop    stop it if it runs (the test command's exit trap)
#
# `cargo test --workspace` runs it too, in the foreground; the test command skips it there
# (`--skip every_interleaving`).
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${CARGO_TARGET_DIR:-$PWD/target}/model-check"
case "${1:-}" in
  start)
    mkdir -p "$dir"
    rm -f "$dir/status" "$dir/log" "$dir/pid"
    # The test binary's path, as cargo built it for the whole workspace (the same features as
    # `scripts/build.sh`: nothing is compiled here).
    binary="$(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
      python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "model_check" and m.get("executable"):
        print(m["executable"])
')"
    if [[ -z "$binary" ]]; then
      echo "model-check: no model_check test binary; run scripts/build.sh first" >&2
      exit 1
    fi
    (
      set +e
      nice -n 19 "$binary" > "$dir/log" 2>&1
      echo $? > "$dir/status.tmp" && mv "$dir/status.tmp" "$dir/status"
    ) &
    echo $! > "$dir/pid"
    echo "model-check: started in the background ($binary)"
    ;;
  wait)
    if [[ ! -f "$dir/pid" ]]; then
      echo "model-check: not started" >&2
      exit 1
    fi
    waited=0
    until [[ -f "$dir/status" ]]; do
      if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null && [[ ! -f "$dir/status" ]]; then
        cat "$dir/log"
        echo "model-check: it stopped without a status (killed?)" >&2
        exit 1
      fi
      if (( waited % 60 == 0 )); then
        echo "model-check: waiting for the model checker (${waited}s so far)"
      fi
      sleep 5
      waited=$((waited + 5))
    done
    cat "$dir/log"
    status="$(cat "$dir/status")"
    echo "model-check: finished with status $status (waited ${waited}s)"
    exit "$status"
    ;;
  stop)
    if [[ -f "$dir/pid" && ! -f "$dir/status" ]]; then
      pkill -P "$(cat "$dir/pid")" 2>/dev/null || true
      kill "$(cat "$dir/pid")" 2>/dev/null || true
    fi
    ;;
  *)
    echo "usage: scripts/model-check.sh start|wait|stop" >&2
    exit 2
    ;;
esac
