"""Load and soak for one gateway process: loopback only, bounded in time.

    python -m benchmarks.soak                         # a 500-stream burst, then a 10-min soak
    python -m benchmarks.soak burst --streams 500
    python -m benchmarks.soak soak --minutes 10 --concurrency 32
    python -m benchmarks.soak upstream --port 0       # the slow upstream alone

It starts a slow streaming upstream (this module, `upstream`) and `compactgate serve` (one
worker) on 127.0.0.1, then:

- burst: `--streams` streaming requests at once, each streamed slowly by the upstream; every one
  must finish (200, every chunk, `[DONE]`), and afterwards the gateway's live Python objects
  (within 3 %), sockets and asyncio tasks must be back where they were, and its RSS must not grow
  from one round to the next (the arenas a peak leaves are reused, see gateway/ops/memory.py; the
  RSS kept over the warmed-up baseline is reported);
- soak: `--concurrency` clients in a closed loop for `--minutes`, mixing streaming and
  non-streaming requests, conversations that need compaction, and several tenants; zero errors,
  RSS growth from the end of the warm-up to the end under 5 %, and no sockets or tasks left over
  once the load stops.

Everything is read from the gateway process itself: RSS and file descriptors from /proc/<pid>,
asyncio tasks and in-flight requests from its /metrics (`compactgate_asyncio_tasks`,
`compactgate_inflight_requests`). The test suite runs short versions
(benchmarks/test_soak_short.py).
Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
IDLE_TRIM_INTERVAL_S = 5.0  # gateway.ops.memory.INTERVAL_S: how often an idle worker may trim
PACE_HEADER = "x-soak-pace"  # "<chunks>,<interval seconds>": how the upstream streams this request


# -- the slow upstream ---------------------------------------------------------------------------


def _chunk(created: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
    event = {
        "id": "chatcmpl-soak",
        "object": "chat.completion.chunk",
        "created": created,
        "model": "soak",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


async def _chat(request: web.Request) -> web.StreamResponse:
    payload = orjson.loads(await request.read())
    chunks, interval = 5, 0.05
    if pace := request.headers.get(PACE_HEADER):
        first, _, second = pace.partition(",")
        chunks, interval = int(first), float(second)
    usage = {"prompt_tokens": 10, "completion_tokens": chunks, "total_tokens": 10 + chunks}
    created = int(time.time())
    if not payload.get("stream"):
        await asyncio.sleep(interval)
        body = {
            "id": "chatcmpl-soak",
            "object": "chat.completion",
            "created": created,
            "model": "soak",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "tok " * chunks},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    await response.write(_chunk(created, {"role": "assistant", "content": ""}))
    for index in range(chunks):
        await asyncio.sleep(interval)
        await response.write(_chunk(created, {"content": f"tok{index} "}))
    await response.write(_chunk(created, {}, "stop"))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def serve_upstream(host: str, port: int) -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", _chat)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    print(f"READY {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    await stop.wait()
    await runner.cleanup()


# -- what the gateway process looks like from outside ------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    rss: int  # bytes
    blocks: int  # blocks CPython has allocated: live Python objects
    fds: int
    sockets: int
    clients: int  # TCP connections to the gateway's port: its clients
    upstreams: int  # its other TCP connections: to upstreams, in use or pooled
    tasks: int  # asyncio tasks alive in the gateway
    inflight: int  # chat requests being served

    def describe(self) -> str:
        return (
            f"rss={self.rss / 2**20:.1f} MiB heap_blocks={self.blocks} fds={self.fds} "
            f"sockets={self.sockets} (clients={self.clients} upstreams={self.upstreams}) "
            f"tasks={self.tasks} inflight={self.inflight}"
        )


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def sockets_of(pid: int, own_port: int) -> tuple[int, int, int, int]:
    """(file descriptors, sockets, client connections, upstream connections) of the process,
    from /proc/<pid>/fd and the TCP tables (listening sockets are neither kind)."""
    fds = 0
    inodes: set[str] = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        fds += 1
        with contextlib.suppress(OSError):  # closed while we looked
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    clients = upstreams = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[9] not in inodes or fields[3] == "0A":  # 0A: LISTEN
                    continue
                if int(fields[1].rsplit(":", 1)[1], 16) == own_port:
                    clients += 1
                else:
                    upstreams += 1
    return fds, len(inodes), clients, upstreams


_GAUGE = re.compile(
    rb"^(compactgate_asyncio_tasks|compactgate_inflight_requests|"
    rb"compactgate_python_allocated_blocks) ([0-9.e+]+)$",
    re.M,
)


@dataclass(frozen=True)
class Target:
    origin: str  # http://127.0.0.1:<port>
    pid: int

    @property
    def port(self) -> int:
        return int(self.origin.rsplit(":", 1)[1])


async def snapshot(session: aiohttp.ClientSession, target: Target) -> Snapshot:
    async with session.get(f"{target.origin}/metrics") as response:
        text = await response.read()
    gauges = {m.group(1).decode(): int(float(m.group(2))) for m in _GAUGE.finditer(text)}
    fds, sockets, clients, upstreams = sockets_of(target.pid, target.port)
    return Snapshot(
        rss=rss_bytes(target.pid),
        blocks=gauges.get("compactgate_python_allocated_blocks", -1),
        fds=fds,
        sockets=sockets,
        clients=clients,
        upstreams=upstreams,
        tasks=gauges.get("compactgate_asyncio_tasks", 0) - 1,  # less the scrape's own task
        inflight=gauges.get("compactgate_inflight_requests", -1),
    )


async def settled(session: aiohttp.ClientSession, target: Target, timeout: float = 15) -> Snapshot:
    """A snapshot once nothing is in flight and the fd and task counts have stopped moving."""
    deadline = time.monotonic() + timeout
    last = await snapshot(session, target)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = await snapshot(session, target)
        if now.inflight == 0 and now.fds == last.fds and now.tasks == last.tasks:
            return now
        last = now
    return last


async def drained(session: aiohttp.ClientSession, target: Target, timeout: float = 60) -> Snapshot:
    """A snapshot once the gateway's idle upstream connections have expired (keep-alive) and its
    idle trim has had a turn since (gateway/ops/memory.py: freed heap goes back to the system)."""
    deadline = time.monotonic() + timeout
    now = await settled(session, target)
    while now.upstreams and time.monotonic() < deadline:
        await asyncio.sleep(1)
        now = await snapshot(session, target)
    await asyncio.sleep(IDLE_TRIM_INTERVAL_S + 1)
    return await snapshot(session, target)


# -- the clients ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    ok: int = 0
    errors: int = 0
    first_error: str = ""
    latencies: list[float] = field(default_factory=list)

    def fail(self, why: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or why


def chat_body(model: str, stream: bool, turns: int, nonce: str) -> bytes:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a soak test."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{nonce} q{turn}: " + "lorem ipsum " * 20})
        messages.append({"role": "assistant", "content": f"a{turn} " + "dolor sit amet " * 15})
    messages.append({"role": "user", "content": f"{nonce} and now?"})
    return orjson.dumps({"model": model, "stream": stream, "messages": messages})


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    stream: bool,
    chunks: int,
    interval: float,
    tenant: str,
    outcome: Outcome,
) -> None:
    headers = {
        "content-type": "application/json",
        "authorization": f"Bearer sk-soak-{tenant}",
        PACE_HEADER: f"{chunks},{interval}",
    }
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as response:
            data = await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcome.fail(f"{type(exc).__name__}: {exc}")
        return
    if response.status != 200:
        outcome.fail(f"status {response.status}: {data[:300]!r}")
    elif stream and not (
        data.endswith(b"data: [DONE]\n\n") and data.count(b'"content":"tok') == chunks
    ):
        outcome.fail(f"incomplete stream: {data[-300:]!r}")
    elif not stream and b'"choices"' not in data:
        outcome.fail(f"bad body: {data[:300]!r}")
    else:
        outcome.ok += 1
        outcome.latencies.append(time.perf_counter() - started)


def new_session(limit: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300))


# -- burst: many slow streams at once ---------------------------------------------------------


@dataclass
class Round:
    outcome: Outcome
    seconds: float
    before: Snapshot
    peak_rss: int
    after: Snapshot


@dataclass
class BurstResult:
    streams: int
    baseline: Snapshot  # warmed up with the rounds' conversations, upstream pool expired
    rounds: list[Round]
    drained: Snapshot  # after the last round, once the upstream keep-alive pool has expired

    @property
    def retained(self) -> int:
        """RSS bytes still held once it is all over, over the baseline."""
        return self.drained.rss - self.baseline.rss

    @property
    def peak_growth(self) -> int:
        return max(r.peak_rss for r in self.rounds) - self.baseline.rss

    def failures(self) -> list[str]:
        out = []
        first, last = self.rounds[0].after, self.rounds[-1].after
        for number, r in enumerate(self.rounds, 1):
            if r.outcome.errors or r.outcome.ok != self.streams:
                done = f"round {number}: {r.outcome.ok}/{self.streams} streams completed"
                out.append(f"{done}; first error: {r.outcome.first_error}")
            if (
                r.after.inflight
                or r.after.clients > r.before.clients
                or r.after.tasks > r.before.tasks
            ):
                out.append(f"round {number} left work behind: {r.after.describe()}")
        # Live objects come back (a leak would keep them); RSS keeps part of the allocator's
        # high-water mark (CPython's arenas, see gateway/ops/memory.py), so it is held to not
        # growing from one round to the next.
        if self.drained.blocks > self.baseline.blocks * 1.03:
            blocks = f"{self.drained.blocks} blocks, baseline {self.baseline.blocks}"
            out.append(f"Python heap not back to baseline: {blocks}")
        if self.drained.upstreams:
            out.append(f"upstream connections still open: {self.drained.describe()}")
        if last.rss > first.rss * 1.05:
            grew = f"{first.rss / 2**20:.1f} -> {last.rss / 2**20:.1f} MiB"
            out.append(f"RSS grew from round to round: {grew}")
        return out

    def report(self) -> str:
        lines = [f"burst: {len(self.rounds)} rounds of {self.streams} concurrent slow streams"]
        lines.append(f"  baseline: {self.baseline.describe()}")
        for number, r in enumerate(self.rounds, 1):
            lines.append(
                f"  round {number}: {r.outcome.ok}/{self.streams} completed in {r.seconds:.1f} s, "
                f"{r.outcome.errors} errors; peak rss {r.peak_rss / 2**20:.1f} MiB"
            )
            lines.append(f"    after: {r.after.describe()}")
        lines.append(f"  pool expired: {self.drained.describe()}")
        retained, peak = self.retained / 2**20, self.peak_growth / 2**20
        blocks = (self.drained.blocks - self.baseline.blocks) / max(1, self.baseline.blocks)
        lines.append(
            f"  vs baseline: rss {retained:+.1f} MiB (peak {peak:+.1f} MiB), "
            f"heap blocks {blocks:+.1%}"
        )
        return "\n".join(lines)


async def burst(
    target: Target,
    *,
    streams: int = 500,
    chunks: int = 20,
    interval: float = 0.25,
    rounds: int = 2,
    model: str = "soak",
) -> BurstResult:
    """`rounds` times, `streams` slow streaming requests at once; every one must finish, and the
    gateway must let go of them.

    The warm-up sends the rounds' own conversations, 50 at a time: the tokenizer is loaded and
    the per-conversation caches (token counts of each conversation's prefix) already hold what
    the rounds leave in them, without a peak, so the baseline differs from the end only by what
    the burst itself left behind."""
    url = f"{target.origin}/v1/chat/completions"
    async with new_session(limit=50) as session:
        warm = Outcome()
        await asyncio.gather(
            *(
                one_request(
                    session,
                    url,
                    chat_body(model, True, 3, f"b{i}"),
                    stream=True,
                    chunks=2,
                    interval=0.01,
                    tenant=f"t{i % 10}",
                    outcome=warm,
                )
                for i in range(streams)
            )
        )
    results: list[Round] = []
    async with new_session(limit=4) as probe:
        baseline = await drained(probe, target)
        for _ in range(rounds):
            before = await settled(probe, target)
            outcome = Outcome()
            peak = before.rss
            started = time.monotonic()
            async with new_session(limit=0) as session:
                jobs = [
                    asyncio.ensure_future(
                        one_request(
                            session,
                            url,
                            chat_body(model, True, 3, f"b{i}"),
                            stream=True,
                            chunks=chunks,
                            interval=interval,
                            tenant=f"t{i % 10}",
                            outcome=outcome,
                        )
                    )
                    for i in range(streams)
                ]
                while not all(j.done() for j in jobs):
                    peak = max(peak, rss_bytes(target.pid))
                    await asyncio.sleep(0.2)
                await asyncio.gather(*jobs)
            seconds = time.monotonic() - started
            await asyncio.sleep(0.5)  # the closed client connections reach the gateway
            results.append(Round(outcome, seconds, before, peak, await settled(probe, target)))
        pool_expired = await drained(probe, target)
    return BurstResult(streams, baseline, results, pool_expired)


# -- soak: steady load ---------------------------------------------------------------------------


@dataclass
class SoakResult:
    seconds: float
    outcome: Outcome
    idle_before: Snapshot
    start: Snapshot  # after the warm-up
    end: Snapshot  # at the end of the load
    idle_after: Snapshot
    samples: list[tuple[float, int]]  # (seconds, rss)

    @property
    def growth(self) -> float:
        return (self.end.rss - self.start.rss) / self.start.rss

    def failures(self) -> list[str]:
        out = []
        if self.outcome.errors:
            out.append(f"{self.outcome.errors} errors; first: {self.outcome.first_error}")
        if self.growth >= 0.05:
            out.append(f"RSS grew {self.growth:.1%} under steady load")
        after, before = self.idle_after, self.idle_before
        if after.inflight or after.clients > before.clients or after.tasks > before.tasks:
            out.append(f"left over: before {before.describe()}; after {after.describe()}")
        return out

    def report(self) -> str:
        rate = self.outcome.ok / self.seconds if self.seconds else 0.0
        latencies = sorted(self.outcome.latencies) or [0.0]
        p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
        trace = " ".join(
            f"{t:.0f}s:{rss / 2**20:.1f}"
            for t, rss in self.samples[:: max(1, len(self.samples) // 12)]
        )
        return (
            f"soak: {self.outcome.ok} requests in {self.seconds:.0f} s ({rate:.0f}/s), "
            f"{self.outcome.errors} errors, p50 {p50 * 1000:.0f} ms p99 {p99 * 1000:.0f} ms\n"
            f"  idle before:   {self.idle_before.describe()}\n"
            f"  after warm-up: {self.start.describe()}\n"
            f"  end of load:   {self.end.describe()} (rss {self.growth:+.2%})\n"
            f"  idle after:    {self.idle_after.describe()}\n"
            f"  rss MiB over time: {trace}"
        )


async def soak(
    target: Target,
    *,
    seconds: float,
    concurrency: int = 32,
    warmup: float | None = None,
    tenants: int = 8,
) -> SoakResult:
    """A closed loop of `concurrency` clients for `seconds`: a steady mix of streaming and
    non-streaming requests, every conversation distinct, a quarter needing compaction, several
    tenants. RSS growth is measured from the end of the warm-up to the end of the load."""
    url = f"{target.origin}/v1/chat/completions"
    warmup = min(60.0, seconds * 0.2) if warmup is None else warmup
    outcome = Outcome()
    samples: list[tuple[float, int]] = []
    counter = itertools.count()
    async with new_session(limit=4) as probe:
        idle_before = await settled(probe, target)
        started = time.monotonic()
        stop_at = started + seconds

        async def client(session: aiohttp.ClientSession) -> None:
            while time.monotonic() < stop_at:
                n = next(counter)
                stream = n % 3 != 0
                model = "soak-tiny" if n % 4 == 0 else "soak"
                body = chat_body(model, stream, 2 + n % 7, f"s{n}")
                await one_request(
                    session,
                    url,
                    body,
                    stream=stream,
                    chunks=4,
                    interval=0.03,
                    tenant=f"t{n % tenants}",
                    outcome=outcome,
                )

        async with new_session(limit=concurrency) as session:
            workers = [asyncio.ensure_future(client(session)) for _ in range(concurrency)]
            await asyncio.sleep(warmup)
            start = await snapshot(probe, target)
            while time.monotonic() < stop_at:
                samples.append((time.monotonic() - started, rss_bytes(target.pid)))
                await asyncio.sleep(min(5.0, max(0.2, stop_at - time.monotonic())))
            end = await snapshot(probe, target)
            await asyncio.gather(*workers)
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.5)
        idle_after = await settled(probe, target)
    return SoakResult(elapsed, outcome, idle_before, start, end, idle_after, samples)


def leftovers(fresh: Snapshot, final: Snapshot) -> list[str]:
    """Once the upstream keep-alive pool has expired, the process holds exactly the descriptors
    and tasks it held before the first request."""
    if final.fds > fresh.fds or final.sockets > fresh.sockets or final.tasks > fresh.tasks:
        return [f"not back to the fresh process: before {fresh.describe()}; now {final.describe()}"]
    return []


def gateway_config(upstream: str) -> dict[str, Any]:
    model = {
        "upstream": {"base_url": upstream},
        "tokenizer": "chars:4",
        "retry": {"max_attempts": 1},
    }
    return {
        "models": [
            {"name": "soak", "context_window": 100_000, **model},
            {"name": "soak-tiny", "context_window": 1_500, "max_output_tokens": 100, **model},
        ]
    }


class Process:
    """A child process in its own group, its output drained into memory by a thread."""

    def __init__(self, argv: list[str], ready: str | None, timeout: float = 60) -> None:
        self.popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
        )
        self.lines: collections.deque[str] = collections.deque(maxlen=400)
        self._ready = threading.Event()
        self._pattern = re.compile(ready) if ready else None
        self.port = 0
        threading.Thread(target=self._drain, daemon=True).start()
        if self._pattern is not None and not self._ready.wait(timeout):
            self.fail("did not start")

    def fail(self, why: str) -> None:
        self.stop()
        raise RuntimeError(f"{' '.join(self.popen.args)} {why}:\n" + "\n".join(self.lines))

    def _drain(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            if self._pattern and not self._ready.is_set() and (match := self._pattern.search(line)):
                self.port = int(match.group(1))
                self._ready.set()

    def wait_healthy(self, url: str, timeout: float = 60) -> None:
        """Poll `url` until it answers 200 (for a server told to log nothing at info level)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.popen.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.fail("did not become healthy")

    def stop(self) -> int:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        return self.popen.returncode


@contextlib.contextmanager
def running_stack(workdir: Path) -> Iterator[Target]:
    """The slow upstream and one gateway worker on loopback."""
    upstream = Process(
        [sys.executable, "-m", "benchmarks.soak", "upstream", "--port", "0"], r"^READY (\d+)"
    )
    try:
        config = workdir / "soak-gateway.json"
        config.write_text(json.dumps(gateway_config(f"http://127.0.0.1:{upstream.port}/v1")))
        port = _free_port()
        gateway = Process(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            None,
        )
        gateway.wait_healthy(f"http://127.0.0.1:{port}/healthz")
        try:
            yield Target(f"http://127.0.0.1:{port}", gateway.popen.pid)
        finally:
            code = gateway.stop()
            if code != 0:
                print(f"gateway exited with {code}; last output:\n" + "\n".join(gateway.lines))
    finally:
        upstream.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _raise_fd_limit() -> None:
    """500 streams need ~1,000 descriptors in the gateway and as many here; children inherit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _run(args: argparse.Namespace) -> int:
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp, running_stack(Path(tmp)) as target:
        print(f"gateway {target.origin} pid {target.pid}", flush=True)
        async with new_session(limit=1) as probe:
            fresh = await settled(probe, target)
        if args.command in ("all", "burst"):
            result = await burst(
                target,
                streams=args.streams,
                chunks=args.chunks,
                interval=args.interval,
                rounds=args.rounds,
            )
            print(result.report(), flush=True)
            failures += result.failures()
        if args.command in ("all", "soak"):
            outcome = await soak(target, seconds=args.minutes * 60, concurrency=args.concurrency)
            print(outcome.report(), flush=True)
            failures += outcome.failures()
        async with new_session(limit=1) as probe:
            final = await drained(probe, target)
        print(f"fresh process: {fresh.describe()}\nat the end, pool expired: {final.describe()}")
        failures += leftovers(fresh, final)
    for failure in failures:
        print(f"FAILED: {failure}")
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command", nargs="?", default="all", choices=["all", "burst", "soak", "upstream"]
    )
    parser.add_argument("--streams", type=int, default=500, help="burst: concurrent streams (500)")
    parser.add_argument("--chunks", type=int, default=20, help="burst: chunks per stream (20)")
    parser.add_argument(
        "--interval", type=float, default=0.25, help="burst: seconds between chunks (0.25)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="burst: how many bursts (2)")
    parser.add_argument("--minutes", type=float, default=10.0, help="soak: how long (10)")
    parser.add_argument(
        "--concurrency", type=int, default=32, help="soak: clients in the loop (32)"
    )
    parser.add_argument("--port", type=int, default=0, help="upstream: port to listen on")
    args = parser.parse_args(argv)
    if args.command == "upstream":
        asyncio.run(serve_upstream("127.0.0.1", args.port))
        return 0
    _raise_fd_limit()
    return asyncio.run(_run(args))


if __name__ == "__main__":
    raise SystemExit(main())
