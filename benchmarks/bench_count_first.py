"""Two checkouts' gateway code on a first-seen request that must be counted before it goes.

    python -m benchmarks.bench_count_first --base /path/to/other/checkout [--rounds 8]
        [--requests 20]

The request is the 200-message agent body, every message new, on the 128k model whose trigger
its byte bound reaches (`compare`'s `agent-count`), prepared in-process with no upstream call:
parse, bounds, counting until it fits. Each checkout runs in its own process
(`benchmarks/count_first_worker.py` with PYTHONPATH at that checkout), one batch of requests
each in turn, the order reversed every other round, so a busy machine slows them alike. Printed:
per round the median wall and CPU ms per request of each, and the median over the rounds of the
CPU ratio (this checkout to the base), with the load average. CPU is the figure to read on a
shared machine: wall time also holds the waits for a core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "count_first_worker.py"


def measure(checkout: Path, requests: int, offset: int) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        [sys.executable, "-P", str(WORKER), str(requests), str(offset)],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_count_first")
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ratios = []
    sides = {"this": HERE, "base": args.base.resolve()}
    for round_ in range(args.rounds):
        figures = {}
        for name in ("this", "base") if round_ % 2 else ("base", "this"):
            figures[name] = measure(sides[name], args.requests, (round_ + 1) * 1000)
        ratios.append(figures["this"][1] / figures["base"][1])
        shown = (f"{name} {wall:.2f} ms, CPU {cpu:.2f} ms" for name, (wall, cpu) in figures.items())
        print(f"round {round_ + 1}: " + "  ".join(shown))
    print(
        f"CPU this / base: median {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f})"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
