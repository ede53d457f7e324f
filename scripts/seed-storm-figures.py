#!/usr/bin/env python3
"""The reference retry-storm simulation (../shared/reference/seed_storm.py, imported as it is)
on a chosen N, jitter and window, printing one JSON line of figures as
functions/cli/examples/seed_storm.rs prints them: the peak second's arrivals, every attempt,
the arrivals within capacity and over it, and the last second with any.

The seed's function returns only its arrivals, so with --count every attempt is counted by
wrapping random.uniform (one call per attempt for full and equal jitter); that run is slower
and is not the one timed. Without it, `attempts` is null.

Usage: scripts/seed-storm-figures.py N JITTER WINDOW_SECONDS [SEED] [--count]
"""

import json
import os
import random
import sys
from pathlib import Path

CAPACITY = 500


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--count"]
    count = "--count" in sys.argv[1:]
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    n, jitter, window = int(args[0]), args[1], int(args[2])
    seed = int(args[3]) if len(args) > 3 else 1
    root = Path(__file__).resolve().parent.parent
    reference = Path(os.environ.get("SEED_STORM_PY", root.parent / "shared/reference/seed_storm.py"))
    sys.path.insert(0, str(reference.parent))
    import seed_storm  # noqa: E402  (the seed's own code)

    random.seed(seed)
    attempts = None
    if count:
        calls = [0]
        uniform = random.uniform

        def counted(a, b):
            calls[0] += 1
            return uniform(a, b)

        seed_storm.random.uniform = counted
    peak, arrivals = seed_storm.simulate_retry_storm(n, jitter=jitter, window_seconds=window)
    if count and jitter in ("full", "equal"):
        attempts = calls[0]
    last = max((s for s, a in enumerate(arrivals) if a > 0), default=0)
    print(
        json.dumps(
            {
                "peak": peak,
                "attempts": attempts,
                "within_capacity": sum(min(a, CAPACITY) for a in arrivals),
                "over_capacity": sum(max(0, a - CAPACITY) for a in arrivals),
                "last_second": last,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
