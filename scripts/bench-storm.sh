#!/usr/bin/env bash
# Benchmark of issue 5 point 4 (not a test): `hookwise storm` against seed 003's own Python
# (../shared/reference/seed_storm.py) on the same workload, side by side in one run:
# N = 1 000 000, full jitter, b = 2, m = 6, capacity 500. Then N = 10³ against N = 10⁹ for
# hookwise alone, to show that the cost does not grow with N.
# Usage: scripts/bench-storm.sh            (from the repository root or anywhere in it)
# With BENCH_JSON=FILE the side-by-side figures are also written there (for scripts/bench.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
reference="${SEED_STORM_PY:-$root/../shared/reference/seed_storm.py}"
[ -f "$reference" ] || { echo "seed 003's reference code not found at $reference (set SEED_STORM_PY)" >&2; exit 2; }

cargo build --release -p hookwise-cli >&2
bin="$root/target/release/hookwise"
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

echo "workload: N = 1,000,000, full jitter, b = 2, m = 6, capacity 500"
rust=$(best_of 5 "$bin" storm --config "$config" --seed 1)
python=$(best_of 1 python3 "$reference" 1000000 full)
ratio=$(python3 -c "print(f'{$python / $rust:.0f}')")
printf '%-44s %10s s\n' "hookwise storm (release)" "$rust"
printf '%-44s %10s s\n' "python3 seed_storm.py 1000000 full" "$python"
printf '%-44s %10s x faster\n' "ratio (python / hookwise)" "$ratio"
if [ -n "${BENCH_JSON:-}" ]; then
  printf '{"hookwise_seconds": %s, "python_seconds": %s}\n' "$rust" "$python" >"$BENCH_JSON"
fi

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
