"""First-seen counting at c=32 with 1, 2 and 4 workers, against the relay floor (design D13.7).

Run: `python -m benchmarks.bench_workers [--rounds 4] [--seconds 4]`. About two minutes; no
network. Needs `redis-server` on PATH.

Started here, on loopback: the benchmark's fast upstream, a redis-server (the workers' shared
store), the relay floor (`benchmarks.relay_floor`, one process), and three gateways from the
CLI (`compactgate serve --workers N`, N = 1, 2, 4, the config of `benchmarks.run` with the
Redis store). The workload is `gateway-count`'s: the 200-message agent body, every message new,
on the 128k model whose trigger its byte bound reaches, so the gateway counts it exactly before
forwarding it (CPU-bound: what more workers are for). 32 requests in flight, in rounds that
alternate the targets' order, so a busy machine slows them alike.

Printed per target: requests per second, p50 latency, p50 added over the upstream direct, CPU
ms per request of the target's process tree, during its batches and all in (each batch's CPU
read until the target is quiet again: a gateway forwards a request once its count fits and
counts the rest in the background, work that would otherwise run beside the next target's
batch); then, for each gateway, its added p50 over the relay's and its throughput over one
worker's and over the relay's. The machine's load average comes first and last: the workers
share its cores with the load generator, the upstream and the relay.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis

from . import load, targets, workloads
from .load import Batch, Target

CONCURRENCY = 32
WORKERS = (1, 2, 4)
QUIET_STEP_S = 0.5  # a target is quiet (done with what it put off) when over this long it
QUIET_SHARE = 0.03  # used less than this share of one core
QUIET_LIMIT_S = 30.0
WARMUP_S = 3.0


def start_redis(workdir: Path) -> tuple[targets.Service, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise targets.StartError("redis-server is not on PATH")
    port = targets.free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process, log = targets.spawn("redis", argv, workdir)
    service = targets.Service("redis", process, port, log)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            return service, f"redis://127.0.0.1:{port}/0"
        except redis.RedisError:
            if time.monotonic() > deadline or not service.alive():
                raise targets.StartError(f"redis did not start\n{service.log_tail()}") from None
            time.sleep(0.1)


def start_workers(workdir: Path, config_text: str, workers: int) -> targets.Service:
    name = f"workers-{workers}"
    config = workdir / f"{name}.yaml"
    config.write_text(config_text)
    port = targets.free_port()
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
    argv += ["--workers", str(workers), "--log-level", "warning"]
    process, log = targets.spawn(name, argv, workdir)
    return targets.Service(name, process, port, log)


def ready(service: targets.Service, workers: int, timeout: float = 120) -> None:
    """/readyz answers 200 and every worker process is up (a worker still importing does not
    accept; the warm-up batch then reaches it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            answered = httpx.get(f"{service.origin}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            answered = False
        processes = workers + 1 if workers > 1 else 1  # the parent, then each worker
        if answered and len(load.process_tree(service.pid)) >= processes:
            time.sleep(2.0 if workers > 1 else 0.0)  # the last workers finish starting
            return
        if time.monotonic() > deadline or not service.alive():
            raise targets.StartError(f"{service.name} never ready\n{service.log_tail()}")
        time.sleep(0.3)


async def settled(pids: list[int], limit: float = QUIET_LIMIT_S) -> None:
    """Until `pids` are quiet (under `QUIET_SHARE` of a core over `QUIET_STEP_S`) or `limit`
    seconds have passed: the work a gateway put off (late counts) is done."""
    deadline = time.monotonic() + limit
    last = load.cpu_seconds(pids)
    while time.monotonic() < deadline:
        await asyncio.sleep(QUIET_STEP_S)
        now = load.cpu_seconds(pids)
        if now - last < QUIET_SHARE * QUIET_STEP_S:
            return
        last = now


async def measure(
    fronts: dict[str, Target], rounds: int, seconds: float
) -> tuple[dict[str, list[Batch]], dict[str, list[float]]]:
    """Each front's batches, and per batch its CPU ms per request all in: the target's process
    tree from the batch's start until it is quiet again (`settled`). Work a gateway puts off,
    such as late counts, is so charged to its own batch, and never runs beside another
    target's. The warm-up is `WARMUP_S` of load per target, so that every worker has loaded its
    tokenizer (about a second of CPU each, the first time it counts)."""
    batches: dict[str, list[Batch]] = {name: [] for name in fronts}
    all_in: dict[str, list[float]] = {name: [] for name in fronts}
    index = 0
    async with load.new_session(CONCURRENCY) as session:
        for target in fronts.values():
            warm = await load.run(
                session,
                target,
                stream=False,
                concurrency=CONCURRENCY,
                requests=1_000_000,
                max_seconds=WARMUP_S,
                first_index=index,
            )
            index += warm.sent
            await settled(list(target.pids))
        for round_number in range(rounds):
            names = list(fronts)
            shift = round_number % len(names)
            names = names[shift:] + names[:shift]
            for name in names:
                target = fronts[name]
                cpu_before = load.cpu_seconds(target.pids)
                batch = await load.run(
                    session,
                    target,
                    stream=False,
                    concurrency=CONCURRENCY,
                    requests=1_000_000,
                    max_seconds=seconds,
                    first_index=index,
                )
                await settled(list(target.pids))
                cpu = load.cpu_seconds(target.pids) - cpu_before
                index += batch.sent
                if batch.errors:
                    raise RuntimeError(f"{name}: {batch.errors} errors: {batch.first_error}")
                batches[name].append(batch)
                all_in[name].append(1000 * cpu / max(1, batch.count))
    return batches, all_in


def report(batches: dict[str, list[Batch]], all_in: dict[str, list[float]]) -> None:
    rate = {n: statistics.median(b.count / b.elapsed for b in bs) for n, bs in batches.items()}
    p50 = {n: statistics.median(load.median(b.latencies) for b in bs) for n, bs in batches.items()}
    cpu = {
        n: statistics.median(1000 * b.cpu_seconds / max(1, b.count) for b in bs)
        for n, bs in batches.items()
    }
    for name in batches:
        added = p50[name] - p50["direct"]
        spread = ", ".join(f"{b.count / b.elapsed:.0f}" for b in batches[name])
        print(
            f"{name:<10} {rate[name]:7.1f} req/s  p50 {1000 * p50[name]:7.1f} ms  "
            f"added {1000 * added:7.1f} ms  CPU {cpu[name]:6.1f} ms/req in its batches, "
            f"{statistics.median(all_in[name]):6.1f} all in  (rounds: {spread})"
        )
    relay_added = p50["relay"] - p50["direct"]
    gateways = sorted(int(n.split("-")[1]) for n in batches if n.startswith("workers-"))
    base = f"workers-{gateways[0]}"
    for workers in gateways:
        name = f"workers-{workers}"
        added = p50[name] - p50["direct"]
        print(
            f"{name:<10} added p50 / relay's = {added / relay_added:6.2f}   "
            f"req/s / {base}'s = {rate[name] / rate[base]:.2f}   "
            f"req/s / relay's = {rate[name] / rate['relay']:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_workers")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0, help="per target and round")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=list(WORKERS), help="the gateways' workers"
    )
    args = parser.parse_args(argv)
    started: list[targets.Service] = []
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        workdir = Path(tmp)
        try:
            upstream = targets.start_upstream(workdir)
            started.append(upstream)
            store, url = start_redis(workdir)
            started.append(store)
            relay = targets.start_relay(workdir, upstream)
            started.append(relay)
            config = targets.gateway_config(upstream, upstream) + f"store: {url}\n"
            gateways = {n: start_workers(workdir, config, n) for n in args.workers}
            started += gateways.values()
            for n, service in gateways.items():
                ready(service, n)
            body = workloads.agent(targets.COUNT_MODEL).first_time
            path = "/v1/chat/completions"
            fronts = {
                "direct": Target(upstream.origin + path, body, pids=[upstream.pid]),
                "relay": Target(relay.origin + path, body, pids=[relay.pid]),
            }
            for n, service in gateways.items():  # CPU: the parent and, read each time, its workers
                fronts[f"workers-{n}"] = Target(service.origin + path, body, pids=[service.pid])
            report(*asyncio.run(measure(fronts, args.rounds, args.seconds)))
        finally:
            for service in reversed(started):
                service.stop()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
