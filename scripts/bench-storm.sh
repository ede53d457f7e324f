#!/usr/bin/env bash
# Benchmark (not a test): `hookwise storm` against the reference Python simulation
# (../shared/reference/seed_storm.py, through scripts/seed-storm-figures.py to set its window)
# and against the seed's method written in Rust (functions/cli/examples/seed_storm.rs), on
# one workload and window, best of the same number of runs, their figures side by side:
# N = 1 000 000, full jitter, b = 2, m = 6, capacity 500, 180 s. Then N = 10³ against
# N = 10⁹ for hookwise alone, to show that the cost does not grow with N.
# Usage: scripts/bench-storm.sh            (from the repository root or anywhere in it)
# With BENCH_JSON=FILE the side-by-side figures are also written there (for scripts/bench.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
reference="${SEED_STORM_PY:-$root/../shared/reference/seed_storm.py}"
[ -f "$reference" ] || { echo "the reference storm simulation not found at $reference (set SEED_STORM_PY)" >&2; exit 2; }
export SEED_STORM_PY="$reference"

cargo build --release -p hookwise-cli --bin hookwise --example seed_storm >&2
bin="$root/target/release/hookwise"
seed_bin="$root/target/release/examples/seed_storm"
config="$(mktemp)"
trap 'rm -f "$config"' EXIT
cat >"$config" <<'YAML'
retry_policy:
  backoff_base_seconds: 2
  max_tier: 6
  jitter: full
  consumer_capacity_rps: 500
  simulation:
    worst_case_failure_population: 1000000
    window_seconds: 180
YAML

# Wall time of a command in seconds (best of $2 runs), its output discarded.
best_of() {
  local runs=$1; shift
  python3 - "$runs" "$@" <<'PY'
import subprocess, sys, time
runs, cmd = int(sys.argv[1]), sys.argv[2:]
best = float("inf")
for _ in range(runs):
    t = time.perf_counter()
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    best = min(best, time.perf_counter() - t)
print(f"{best:.4f}")
PY
}

runs=3
echo "workload: N = 1,000,000, full jitter, b = 2, m = 6, capacity 500, window 180 s; best of $runs runs each"
echo "(hookwise storm models the queue over time with cohorts of deliveries; the seed's method,"
echo " in its Python and in Rust, draws per delivery and folds seconds modulo the window:"
echo " different models, so their figures differ; the two seed runs do the same work)"
rust=$(best_of $runs "$bin" storm --config "$config" --seed 1)
seed_rust=$(best_of $runs "$seed_bin" 1000000 full 180 1)
python=$(best_of $runs python3 scripts/seed-storm-figures.py 1000000 full 180 1)
hookwise_figures=$("$bin" storm --config "$config" --seed 1 --json)
seed_rust_figures=$("$seed_bin" 1000000 full 180 1)
python_figures=$(python3 scripts/seed-storm-figures.py 1000000 full 180 1 --count)
python3 - "$rust" "$seed_rust" "$python" "$hookwise_figures" "$seed_rust_figures" "$python_figures" "$runs" "${BENCH_JSON:-}" <<'PY'
import json, sys
rust, seed_rust, python = (float(x) for x in sys.argv[1:4])
h, r, p = (json.loads(x) for x in sys.argv[4:7])
runs, out = int(sys.argv[7]), sys.argv[8]
rows = [
    ("", "peak/s", "attempts", "delivered", "drain s", "seconds"),
    ("hookwise storm (cohorts)", h["peak_offered_rps"], h["total_attempts"], h["delivered"], h["drain_seconds"], f"{rust:.4f}"),
    ("seed's method in Rust (per delivery)", r["peak"], r["attempts"], r["within_capacity"], r["last_second"], f"{seed_rust:.4f}"),
    ("seed's Python (per delivery)", p["peak"], p["attempts"], p["within_capacity"], p["last_second"], f"{python:.4f}"),
]
for row in rows:
    print(f"{row[0]:<40}" + "".join(f"{str(c):>12}" for c in row[1:]))
print(f"same work, language: Python / Rust, seed's method      {python / seed_rust:8.1f}x")
print(f"algorithm: seed's method in Rust / hookwise storm      {seed_rust / rust:8.1f}x")
print(f"both: Python / hookwise storm                          {python / rust:8.1f}x")
if r["attempts"] != p["attempts"] and p["attempts"] is not None:
    print("(the two seed runs draw from different generators: their attempts differ by chance, not by method)")
if out:
    json.dump({
        "runs": runs, "hookwise_seconds": rust, "seed_rust_seconds": seed_rust, "python_seconds": python,
        "hookwise": {"peak": h["peak_offered_rps"], "attempts": h["total_attempts"], "delivered": h["delivered"], "drain": h["drain_seconds"]},
        "seed_rust": {"peak": r["peak"], "attempts": r["attempts"], "delivered": r["within_capacity"], "drain": r["last_second"]},
        "seed_python": {"peak": p["peak"], "attempts": p["attempts"], "delivered": p["within_capacity"], "drain": p["last_second"]},
    }, open(out, "w"))
PY

echo
echo "cost against N (hookwise storm, full jitter, b = 2, m = 6, capacity 500):"
for n in 1000 1000000000; do
  t=$(best_of 5 "$bin" storm --config "$config" --seed 1 --population "$n")
  printf '  N = %-12s %10s s\n' "$n" "$t"
done
echo "cost against N (hookwise storm, standard policy, capacity 500):"
for n in 1000 1000000000; do
  t=$(best_of 3 "$bin" storm --policy standard --capacity 500 --seed 1 --population "$n")
  printf '  N = %-12s %10s s\n' "$n" "$t"
done
