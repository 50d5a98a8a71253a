"""The default chain of two checkouts on the same 200-message requests, in one run.

    python -m benchmarks.bench_chain_ab --base /path/to/other/checkout [--base ...]
        [--repeat 60] [--instructions 10]

The requests are `bench_fidelity`'s (English, agent and chat shapes, compacted to half their
size), first seen and resent. Each checkout's code runs in its own process
(`benchmarks/chain_worker.py` with PYTHONPATH at that checkout), the way its gateway runs the
chain. Printed: the median CPU ms of each base's default chain, this checkout's, and this
checkout's without its ledger step, one request of each in turn so a busy machine slows them
alike; with `--instructions N`, the instructions each takes per request, counted by valgrind
(a run of N requests with the chain less one without it, after one warm-up request each).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import orjson

from tests.fidelity_sessions import session

HERE = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "chain_worker.py"
VALGRIND = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
CASES = [(shape, seen) for shape in ("agent", "chat") for seen in ("first", "resent")]


def bodies() -> dict[str, str]:
    """bench_fidelity's 200-message requests: the first 200 messages and the last user one."""
    out = {}
    for shape, turns in (("agent", 67), ("chat", 100)):
        s = session(0, "en", shape, turns=turns)
        out[shape] = orjson.dumps([*s.messages[:200], s.messages[-1]]).decode()
    return out


def worker(checkout: Path, path: Path, wrap: Sequence[str] = ()) -> list[str]:
    env = f"PYTHONHASHSEED=0 PYTHONPATH={checkout}"
    return ["env", *env.split(), *wrap, sys.executable, "-P", str(WORKER), str(path)]


def cpu_times(variants: dict[str, tuple[Path, str]], path: Path, repeat: int) -> dict:
    procs = {
        name: subprocess.Popen(
            worker(checkout, path), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for name, (checkout, _) in variants.items()
    }
    times: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    try:
        for _ in range(repeat):
            for shape, seen in CASES:
                for name, (_, chain) in variants.items():
                    proc = procs[name]
                    proc.stdin.write(f"time {shape} {seen} {chain} 1\n")
                    proc.stdin.flush()
                    times[(shape, seen, name)].append(float(proc.stdout.readline()))
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    return {key: statistics.median(values) for key, values in times.items()}


def instructions(checkout: Path, chain: str, path: Path, shape: str, seen: str, n: int) -> float:
    """Million instructions of one request's chain: (run - without the chain) / n."""
    collected = []
    for run in (1, 0):
        out = subprocess.run(
            worker(checkout, path, VALGRIND),
            input=f"count {shape} {seen} {chain} {n} {run}\n",
            capture_output=True,
            text=True,
            check=True,
        )
        collected.append(int(re.search(r"Collected : (\d+)", out.stderr).group(1)))
    return (collected[0] - collected[1]) / n / 1e6


def load_average() -> str:
    with open("/proc/loadavg") as file:
        return " ".join(file.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, action="append", required=True)
    parser.add_argument("--repeat", type=int, default=60)
    parser.add_argument("--instructions", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    variants = {str(base): (base.resolve(), "default") for base in args.base}
    variants |= {"this": (HERE, "default"), "this, no ledger": (HERE, "no-ledger")}
    this = list(variants).index("this")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bodies.json"
        path.write_text(orjson.dumps(bodies()).decode())
        print(f"this {HERE}; load {load_average()}")
        if args.instructions:
            print("million instructions per request:")
            print("| shape | request | " + " | ".join(variants) + " | this / first base |")
            print("|---|---|" + "---|" * (len(variants) + 1))
            for shape, seen in CASES:
                counts = [
                    instructions(checkout, chain, path, shape, seen, args.instructions)
                    for checkout, chain in variants.values()
                ]
                cells = " | ".join(f"{c:.2f}" for c in counts)
                print(f"| {shape} | {seen} | {cells} | {counts[this] / counts[0]:.2f} |")
        times = cpu_times(variants, path, args.repeat)
        print(f"median CPU ms per request, {args.repeat} each, interleaved:")
        print("| shape | request | " + " | ".join(variants) + " | this / first base |")
        print("|---|---|" + "---|" * (len(variants) + 1))
        for shape, seen in CASES:
            ms = [times[(shape, seen, name)] for name in variants]
            cells = " | ".join(f"{v:.2f}" for v in ms)
            print(f"| {shape} | {seen} | {cells} | {ms[this] / ms[0]:.2f} |")
        print(f"load {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
