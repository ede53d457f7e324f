#!/usr/bin/env bash
# Growth (tests/benches/growth.rs): throughput, latency, the API's listings and the memory of
# `hookwise dev` (release build) on an empty history and on one of HOOKWISE_GROWTH_DELIVERIES
# (1 000 000) deliveries over 30 days, side by side in one run, with the ratios. Not part of
# the test suite: these machines are shared and noisy.
#
# The seeded data dirs are built once by functions/cli/examples/seed_history.rs, through the
# embedded store's own write path, and kept under target/bench-growth/seed-<N> (its time and
# size in seed-<N>/seed-info.json); each run copies them. Delete a dir to seed it again (after
# a schema change, say). HOOKWISE_BENCH_JSON=FILE also writes the figures there; the other
# HOOKWISE_BENCH_* and HOOKWISE_GROWTH_* settings are in the bench's header.
set -euo pipefail
cd "$(dirname "$0")/.."
deliveries="${HOOKWISE_GROWTH_DELIVERIES:-1000000}"
seeds="$PWD/target/bench-growth"
cargo build --release --quiet -p hookwise-cli
# The seeder's time is SQLite's: the quick-to-build optimised profile is enough.
cargo build --quiet --locked --profile profiling -p hookwise-cli --example seed_history
for n in 0 "$deliveries"; do
  if [[ ! -f "$seeds/seed-$n/seed-info.json" ]]; then
    rm -rf "$seeds/seed-$n"
    mkdir -p "$seeds"
    echo "seeding $n deliveries into $seeds/seed-$n" >&2
    target/profiling/examples/seed_history "$seeds/seed-$n" "$n"
  fi
done
HOOKWISE_BIN="$PWD/target/release/hookwise" \
  HOOKWISE_GROWTH_EMPTY="$seeds/seed-0" HOOKWISE_GROWTH_SEEDED="$seeds/seed-$deliveries" \
  cargo bench --quiet --locked --profile profiling -p hookwise-tests --bench growth
