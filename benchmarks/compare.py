"""Before and after on the request path: this checkout's gateway against another checkout's, with
the relay floor, in one run.

    python -m benchmarks.compare --base /path/to/other/checkout [--rounds 5] [--cases ...]
        [--profile agent-seen-c32]

On a shared machine absolute figures move with the load from one minute to the next, so both
gateways and the relay are measured in the same rounds, one batch each in turn (the order
reversed every other round), and each round gives its own ratios to the relay: CPU time per
request (from /proc, per process) and latency added over the upstream's, and the p50 over the
relay's ("over floor"). The medians over the
rounds are printed with their spread and the machine's load; `--profile CASE` then samples both
gateways with py-spy under that case's load (`benchmarks.profile`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from . import load, profile, targets, workloads

CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Shape:
    body: str  # `small` or `agent` (workloads)
    concurrency: int
    requests: int
    first_time: bool = False  # every message new to the gateway (else one new one appended)
    model: str = targets.PASSTHROUGH_MODEL


SHAPES = {
    "small": Shape("small", 1, 300),
    "small-c32": Shape("small", 32, 1500),
    "agent-seen": Shape("agent", 1, 60),
    "agent-seen-c32": Shape("agent", 32, 400),
    # first seen, fits by its upper bound: forwarded at once, counted in the background
    "agent-first": Shape("agent", 1, 30, first_time=True),
    # first seen, 128k window: its bound reaches the trigger, so it is counted before it goes
    "agent-count": Shape("agent", 1, 30, first_time=True, model=targets.COUNT_MODEL),
    # compacted by the default chain (no policy named), first seen and one message appended
    "agent-default-first": Shape(
        "agent", 1, 30, first_time=True, model=targets.DEFAULT_CHAIN_MODEL
    ),
    "agent-default-seen": Shape("agent", 1, 60, model=targets.DEFAULT_CHAIN_MODEL),
}


def load_average() -> str:
    with open("/proc/loadavg") as file:
        return " ".join(file.read().split()[:3])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


class Run:
    def __init__(self, base: Path) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="compactgate-compare-"))
        self.base = base
        self.services: dict[str, targets.Service] = {}
        self.index = 0  # request numbers are never reused: the appended variant stays "seen"
        self.bodies = {
            (shape.body, shape.model): getattr(workloads, shape.body)(shape.model)
            for shape in SHAPES.values()
        }

    def start(self) -> None:
        upstream = targets.start_upstream(self.workdir)
        emergency = targets.start_upstream(
            self.workdir, "upstream-emergency", targets.EMERGENCY_REJECT_ABOVE
        )
        config = targets.gateway_config(upstream, emergency)
        self.services = {"direct": upstream, "emergency": emergency}
        self.services["after"] = targets.start_gateway(self.workdir, config, "after")
        self.services["before"] = targets.start_gateway(
            self.workdir, config, "before", root=self.base
        )
        self.services["relay"] = targets.start_relay(self.workdir, upstream)

    def stop(self) -> None:
        for service in self.services.values():
            service.stop()

    async def ready(self, session: aiohttp.ClientSession) -> None:
        body = self.bodies["small", targets.PASSTHROUGH_MODEL].template
        for name in ("after", "before"):
            service = self.services[name]
            for _ in range(240):
                try:
                    async with session.post(service.origin + CHAT, data=body) as response:
                        await response.read()
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.5)
            else:
                raise targets.StartError(f"{name} did not answer:\n{service.log_tail()}")

    def target(self, name: str, shape: Shape) -> load.Target:
        service = self.services[name]
        workload = self.bodies[shape.body, shape.model]
        variant = workload.first_time if shape.first_time else workload.appended
        return load.Target(service.origin + CHAT, variant, None, (service.pid,))

    async def batch(
        self, session: aiohttp.ClientSession, name: str, shape: Shape, requests: int
    ) -> load.Batch:
        batch = await load.run(
            session,
            self.target(name, shape),
            stream=False,
            concurrency=shape.concurrency,
            requests=requests,
            max_seconds=30,
            first_index=self.index,
        )
        self.index += batch.sent
        return batch

    async def case(self, session: aiohttp.ClientSession, key: str, rounds: int) -> None:
        shape = SHAPES[key]
        names = ["direct", "relay", "before", "after"]
        cpu: dict[str, list[float]] = {"before": [], "after": []}
        added: dict[str, list[float]] = {"before": [], "after": []}
        own: dict[str, list[float]] = {"before": [], "after": []}
        over: dict[str, list[float]] = {"before": [], "after": []}
        for number in range(rounds):
            p50: dict[str, float] = {}
            cpu_ms: dict[str, float] = {}
            for name in names if number % 2 == 0 else names[::-1]:
                await self.batch(session, name, shape, 2 * shape.concurrency)  # warm-up
                batch = await self.batch(session, name, shape, shape.requests)
                if batch.errors:
                    print(f"  {name}: {batch.errors} errors, first: {batch.first_error}")
                p50[name] = load.median(batch.latencies) * 1000
                cpu_ms[name] = batch.cpu_seconds * 1000 / max(1, batch.count)
            relay_added = p50["relay"] - p50["direct"]
            for name in ("before", "after"):
                cpu[name].append(cpu_ms[name] / cpu_ms["relay"])
                added[name].append((p50[name] - p50["direct"]) / relay_added)
                own[name].append(cpu_ms[name])
                over[name].append(p50[name] - p50["relay"])
        print(f"{key} (load average {load_average()}), medians of {rounds} rounds (spread):")
        for name in ("before", "after"):
            print(
                f"  {name:6}  CPU/req {spread(own[name])} ms  CPU / relay's {spread(cpu[name])}"
                f"  added / relay's {spread(added[name])}  over relay {spread(over[name])} ms"
            )

    async def profile(self, session: aiohttp.ClientSession, key: str, seconds: float) -> None:
        spy, problem = targets.py_spy(300)
        if spy is None:
            print(f"no profile: {problem}")
            return
        shape = SHAPES[key]
        for name in ("before", "after"):

            async def drive(name: str = name) -> None:
                await self.batch(session, name, shape, 10**6)

            out = self.workdir / f"profile-{key}-{name}.txt"
            text, problem = await profile.record(spy, self.services[name].pid, seconds, out, drive)
            print(f"profile of {name} under {key}:")
            print(problem or "\n".join(profile.summarise(text, 15)))


async def main(args: argparse.Namespace) -> None:
    run = Run(args.base)
    run.start()
    session = load.new_session(32)
    try:
        await run.ready(session)
        print(f"load average before: {load_average()}")
        for key in args.cases.split(","):
            await run.case(session, key, args.rounds)
        if args.profile:
            await run.profile(session, args.profile, args.profile_seconds)
        print(f"load average after: {load_average()}")
    finally:
        await session.close()
        run.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (before)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--cases", default="agent-seen-c32,agent-seen,small", help=", ".join(SHAPES)
    )
    parser.add_argument("--profile", choices=sorted(SHAPES), default=None)
    parser.add_argument("--profile-seconds", type=float, default=8)
    return parser


if __name__ == "__main__":
    asyncio.run(main(build_parser().parse_args()))
