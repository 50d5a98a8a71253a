"""Redis commands per request: what sharing through the store costs each request (design D13.3).

    python -m benchmarks.bench_store_calls [--checkout /path/to/other/checkout]
    python -m benchmarks.bench_store_calls --freshness

`--freshness` measures instead how long a window one replica learns takes to reach another:
two `Windows` in this process, each with its own store on the redis-server and the default
`store_sync_s`, the lowering learnt on one at a random moment and the other polled every ms.

One `compactgate serve` (from this checkout, or `--checkout`'s) on a real redis-server, against
the fake upstream, runs the agent session of tests/test_round_robin.py (two conversations of
14 turns and a compaction each; a context error, masked outputs, held events, a summary made
ahead of need). Redis's own `INFO commandstats` is read before and after each turn, and the
commands the gateway's periodic checks send (measured over an idle stretch first) are taken
off; what is left is printed per kind of turn: every turn under its trigger (the agent-seen
case: nothing to compact), over it, and the agent's compactions. Nothing here is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import redis

from tests.fake_upstream import FakeUpstream
from tests.redis_server import free_port
from tests.test_round_robin import KEY, UPSTREAM_LIMIT, body, compaction, config, history

ROOT = Path(__file__).resolve().parent.parent


def commands(client: redis.Redis) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


def start(argv: list[str], cwd: Path, ready: str) -> tuple[subprocess.Popen[str], re.Match[str]]:
    process = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:
        found = re.search(ready, line)
        if found:
            return process, found
    raise RuntimeError(f"{argv[0]} did not start")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the gateway's checkout")
    parser.add_argument("--freshness", action="store_true", help="a lowered window's lag")
    args = parser.parse_args(argv)
    port = free_port()
    processes: list[subprocess.Popen[str]] = []
    try:
        server, _ = start(
            ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
            ROOT,
            "Ready to accept connections",
        )
        processes.append(server)
        if args.freshness:
            asyncio.run(freshness(f"redis://127.0.0.1:{port}/0"))
            return
        fake_process, found = start(
            [sys.executable, "-m", "tests.fake_upstream", "--port", "0"], ROOT, r"^READY (\d+)"
        )
        processes.append(fake_process)
        upstream = FakeUpstream(int(found.group(1)))
        settings: dict[str, Any] = config(upstream, f"redis://127.0.0.1:{port}/0")
        settings.pop("store_sync_s")  # the default period (and a checkout from before the key)
        directory = Path(tempfile.mkdtemp())
        (directory / "gateway.json").write_text(json.dumps(settings))
        gateway_port = free_port()
        gateway, _ = start(
            [sys.executable, "-m", "gateway", "serve", "--config", str(directory / "gateway.json"),
             "--port", str(gateway_port)],
            args.checkout,
            r"Uvicorn running on|CompactGate listening on",
        )  # fmt: skip
        processes.append(gateway)
        measure(redis.Redis(port=port), upstream, f"http://127.0.0.1:{gateway_port}/v1")
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(10)


def measure(client: redis.Redis, upstream: FakeUpstream, base_url: str) -> None:
    http = httpx.Client(timeout=60)
    idle_s = 5.0
    upstream.configure({"context_limit": UPSTREAM_LIMIT})
    kinds: dict[str, list[Counter[str]]] = {"under": [], "over": [], "compaction": []}
    turns: list[tuple[str, dict[str, Any]]] = []
    for task in ("Fix the failing build in the gateway package.", "Now make the tests pass."):
        turns += [("ordinary", body(history(task, steps))) for steps in range(1, 15)]
        turns.append(("compaction", compaction(history(task, 15))))
    seconds = 0.0
    for kind, payload in turns:
        start_at, counted = time.monotonic(), commands(client)
        response = http.post(f"{base_url}/chat/completions", headers=KEY, json=payload)
        time.sleep(0.6)
        upstream.wait_idle()
        spent = commands(client) - counted
        seconds += time.monotonic() - start_at
        if kind == "ordinary":
            headers = response.headers
            over = int(headers["x-compactgate-tokens-after"]) < int(
                headers["x-compactgate-tokens-before"]
            )
            kind = "over" if over else "under"
        kinds[kind].append(spent)
    before = commands(client)  # the periodic checks, running since the first request
    time.sleep(idle_s)
    periodic = commands(client) - before
    rate = (sum(periodic.values()) - 1) / idle_s  # one INFO is ours
    print(f"periodic (idle {idle_s:.0f} s): {rate:.1f} commands/s: {dict(periodic)}")
    for kind, spent in kinds.items():
        if not spent:
            continue
        total: Counter[str] = sum(spent, Counter())
        per = sum(total.values()) / len(spent) - 1 - rate * seconds / len(turns)  # less our INFO
        shown = {k: round(v / len(spent), 1) for k, v in total.most_common() if k != "info"}
        print(f"{kind}: {len(spent)} requests, {per:.1f} commands each net of periodic; {shown}")


async def freshness(url: str, trials: int = 20) -> None:
    from gateway.config import parse_config
    from gateway.ops.metrics import Metrics
    from gateway.path.windows import Windows
    from gateway.routing import Router
    from gateway.store import open_store

    lags = []
    for trial in range(trials):
        model = {"name": f"m{trial}", "upstream": {"base_url": "http://127.0.0.1:9/v1"}}
        config = parse_config({"models": [{**model, "context_window": 100_000}]})
        stores = [open_store(url, Metrics()) for _ in range(2)]
        (learner, reader) = [Windows(Metrics(), store) for store in stores]
        routes = [Router(config).resolve(f"m{trial}") for _ in stores]
        assert routes[0] is not None and routes[1] is not None
        reader.effective(routes[1])
        await stores[1].get("warm")  # its checks start with its first operation
        await asyncio.sleep(random.uniform(0, 1))
        start_at = time.monotonic()
        learner.learn(routes[0], 50_000, "freshness")
        while reader.effective(routes[1]) != 50_000:
            await asyncio.sleep(0.001)
        lags.append(time.monotonic() - start_at)
        for store in stores:
            await store.close()
    lags.sort()
    print(
        f"a lowered window reached the other replica in: median {statistics.median(lags):.3f} s, "
        f"max {lags[-1]:.3f} s over {trials} trials (store_sync_s 1.0)"
    )


if __name__ == "__main__":
    main()
