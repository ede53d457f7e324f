#!/usr/bin/env bash
# `make bench`: every performance figure in one table, each measured side by side with its
# baseline in this one run (these machines are shared and noisy; a ratio holds where a
# figure alone does not). Not a test. What it runs:
#   scripts/bench-storm.sh     the storm calculator against the reference Python simulation
#   scripts/bench-delivery.sh  `hookwise dev` end to end against a bare reqwest loop, and
#                              its memory idle and under that load
#   scripts/bench-latency.sh   ingest-to-first-POST latency under open-loop load, on
#                              `hookwise dev` and on `hookwise dev --aws` (DynamoDB Local, with
#                              LocalStack's SQS and then moto's)
#   scripts/bench-growth.sh    the local figures again with 1 000 000 deliveries stored, side
#                              by side with an empty store, and GET /v1/deliveries' p99
#   scripts/bench-lambda.sh    each Lambda function's start-up and memory against a
#                              lambda_runtime hello-world, on an emulated Runtime API, and
#                              the binaries' sizes
#   scripts/bench-cost.sh      the cost meter: dollars per million events by profile
# then scripts/bench-table.py prints the table (machine, date, figures, goals).
# The release builds use fat LTO, as `sam build` does: the first run takes a while.
# Usage: scripts/bench.sh            (from the repository root or anywhere in it)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# The figures stay in target/bench/*.json: `scripts/bench-table.py target/bench` prints the
# table again.
out="$root/target/bench"
mkdir -p "$out"
rm -f "$out"/*.json

echo "== building the release binaries" >&2
cargo build --release --locked -p hookwise-cli >&2

echo "== storm calculator" >&2
BENCH_JSON="$out/storm.json" scripts/bench-storm.sh >&2
echo "== local delivery throughput and memory" >&2
HOOKWISE_BENCH_JSON="$out/delivery.json" scripts/bench-delivery.sh >&2
echo "== delivery latency under open-loop load" >&2
HOOKWISE_BENCH_JSON="$out/latency.json" scripts/bench-latency.sh >&2
echo "== growth: the same with 1 000 000 deliveries stored" >&2
HOOKWISE_BENCH_JSON="$out/growth.json" scripts/bench-growth.sh >&2
echo "== Lambda start-up, memory and size" >&2
scripts/bench-lambda.sh --json "$out/lambda.json" >&2
echo "== cost per million events" >&2
HOOKWISE_BENCH_JSON="$out/cost.json" scripts/bench-cost.sh >&2

python3 scripts/bench-table.py "$out"
