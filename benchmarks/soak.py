"""Load and soak for one gateway process (issue 10): loopback only, bounded in time.

    python -m benchmarks.soak                         # a 500-stream burst, then a 10-min soak
    python -m benchmarks.soak burst --streams 500
    python -m benchmarks.soak soak --minutes 10 --concurrency 32
    python -m benchmarks.soak upstream --port 0       # the slow upstream alone

It starts a slow streaming upstream (this module, `upstream`) and `compactgate serve` (one
worker) on 127.0.0.1, then:

- burst: `--streams` streaming requests at once, each streamed slowly by the upstream; every one
  must finish (200, every chunk, `[DONE]`), and afterwards the gateway's RSS must come back near
  its baseline, with its sockets and asyncio tasks back where they were;
- soak: `--concurrency` clients in a closed loop for `--minutes`, mixing streaming and
  non-streaming requests, conversations that need compaction, and several tenants; zero errors,
  RSS growth from the end of the warm-up to the end under 5 %, and no sockets or tasks left over
  once the load stops.

Everything is read from the gateway process itself: RSS and file descriptors from /proc/<pid>,
asyncio tasks and in-flight requests from its /metrics (`compactgate_asyncio_tasks`,
`compactgate_inflight_requests`). The test suite runs short versions (tests/test_load_short.py).
Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
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
    fds: int
    sockets: int
    tasks: int  # asyncio tasks alive in the gateway (its /metrics)
    inflight: int

    def describe(self) -> str:
        return (
            f"rss={self.rss / 2**20:.1f} MiB fds={self.fds} sockets={self.sockets} "
            f"tasks={self.tasks} inflight={self.inflight}"
        )


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> tuple[int, int]:
    """(all file descriptors, sockets) of the process."""
    total = sockets = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        total += 1
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                sockets += 1
        except OSError:
            pass  # closed while we looked
    return total, sockets


_GAUGE = re.compile(
    rb"^(compactgate_asyncio_tasks|compactgate_inflight_requests) ([0-9.e+]+)$", re.M
)


async def snapshot(session: aiohttp.ClientSession, origin: str, pid: int) -> Snapshot:
    async with session.get(f"{origin}/metrics") as response:
        text = await response.read()
    gauges = {m.group(1).decode(): int(float(m.group(2))) for m in _GAUGE.finditer(text)}
    fds, sockets = open_fds(pid)
    # the scrape itself is one task and one in-flight connection: leave it out
    return Snapshot(
        rss_bytes(pid),
        fds,
        sockets,
        gauges.get("compactgate_asyncio_tasks", -1) - 1,
        gauges.get("compactgate_inflight_requests", -1),
    )


async def settled(
    session: aiohttp.ClientSession, origin: str, pid: int, seconds: float = 15
) -> Snapshot:
    """A snapshot once nothing is in flight and the fd count has stopped moving."""
    deadline = time.monotonic() + seconds
    last = await snapshot(session, origin, pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = await snapshot(session, origin, pid)
        if now.inflight == 0 and now.fds == last.fds and now.tasks == last.tasks:
            return now
        last = now
    return last


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
        messages.append(
            {"role": "user", "content": f"{nonce} question {turn}: " + "lorem ipsum " * 20}
        )
        messages.append(
            {"role": "assistant", "content": f"answer {turn} " + "dolor sit amet " * 15}
        )
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
    connector = aiohttp.TCPConnector(limit=limit, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300))


@dataclass
class BurstResult:
    streams: int
    outcome: Outcome
    seconds: float
    before: Snapshot
    peak_rss: int
    after: Snapshot

    @property
    def rss_retained(self) -> int:
        return self.after.rss - self.before.rss

    def failures(self) -> list[str]:
        out = []
        if self.outcome.errors or self.outcome.ok != self.streams:
            done = f"{self.outcome.ok}/{self.streams} streams completed"
            out.append(f"{done}; first error: {self.outcome.first_error}")
        grown = self.peak_rss - self.before.rss
        # "back to baseline": at most 10 % above it, or most of what the burst took given back
        if self.rss_retained > max(0.10 * self.before.rss, 0.35 * grown):
            retained = self.rss_retained / 2**20
            out.append(f"RSS stayed {retained:.1f} MiB above baseline (peak +{grown / 2**20:.1f})")
        if self.after.sockets > self.before.sockets or self.after.tasks > self.before.tasks:
            out.append(f"left over: before {self.before.describe()}; after {self.after.describe()}")
        return out

    def report(self) -> str:
        return (
            f"burst: {self.outcome.ok}/{self.streams} streams completed in {self.seconds:.1f} s, "
            f"{self.outcome.errors} errors\n"
            f"  before: {self.before.describe()}\n"
            f"  peak rss: {self.peak_rss / 2**20:.1f} MiB\n"
            f"  after:  {self.after.describe()} (rss {self.rss_retained / 2**20:+.1f} MiB)"
        )


async def burst(
    origin: str,
    pid: int,
    *,
    streams: int = 500,
    chunks: int = 20,
    interval: float = 0.25,
    model: str = "soak",
) -> BurstResult:
    """`streams` slow streaming requests at once; all must finish, and the gateway must let go."""
    url = f"{origin}/v1/chat/completions"
    async with new_session(limit=0) as session:  # warm: tokenizer loaded, pools made
        warm = Outcome()
        await asyncio.gather(
            *(
                one_request(
                    session,
                    url,
                    chat_body(model, True, 2, f"w{i}"),
                    stream=True,
                    chunks=2,
                    interval=0.01,
                    tenant="warm",
                    outcome=warm,
                )
                for i in range(50)
            )
        )
    async with new_session(limit=0) as session:
        before = await settled(session, origin, pid)
        outcome = Outcome()
        peak = before.rss
        started = time.monotonic()
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
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.2)
        await asyncio.gather(*jobs)
        seconds = time.monotonic() - started
    async with new_session(limit=4) as session:  # a fresh pool: the burst's connections are closed
        await asyncio.sleep(1)
        after = await settled(session, origin, pid)
    return BurstResult(streams, outcome, seconds, before, peak, after)


@dataclass
class SoakResult:
    seconds: float
    outcome: Outcome
    start: Snapshot  # after the warm-up
    end: Snapshot  # at the end of the load
    idle_before: Snapshot
    idle_after: Snapshot
    samples: list[tuple[float, int]]

    @property
    def growth(self) -> float:
        return (self.end.rss - self.start.rss) / self.start.rss

    def failures(self) -> list[str]:
        out = []
        if self.outcome.errors:
            out.append(f"{self.outcome.errors} errors; first: {self.outcome.first_error}")
        if self.growth >= 0.05:
            out.append(f"RSS grew {self.growth:.1%} under steady load")
        if (
            self.idle_after.sockets > self.idle_before.sockets
            or self.idle_after.tasks > self.idle_before.tasks
        ):
            before, after = self.idle_before.describe(), self.idle_after.describe()
            out.append(f"left over: before {before}; after {after}")
        return out

    def report(self) -> str:
        rate = self.outcome.ok / self.seconds if self.seconds else 0.0
        latencies = sorted(self.outcome.latencies) or [0.0]
        p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
        return (
            f"soak: {self.outcome.ok} requests in {self.seconds:.0f} s ({rate:.0f}/s), "
            f"{self.outcome.errors} errors, p50 {p50 * 1000:.0f} ms p99 {p99 * 1000:.0f} ms\n"
            f"  idle before: {self.idle_before.describe()}\n"
            f"  after warm-up: rss {self.start.rss / 2**20:.1f} MiB; end of load: rss "
            f"{self.end.rss / 2**20:.1f} MiB ({self.growth:+.2%})\n"
            f"  idle after:  {self.idle_after.describe()}"
        )


async def soak(
    origin: str,
    pid: int,
    *,
    seconds: float,
    concurrency: int = 32,
    warmup: float | None = None,
    tenants: int = 8,
) -> SoakResult:
    """A closed loop of `concurrency` clients for `seconds`: a steady mix of streaming and
    non-streaming requests, conversations that need compaction, several tenants."""
    url = f"{origin}/v1/chat/completions"
    warmup = min(60.0, seconds * 0.2) if warmup is None else warmup
    outcome = Outcome()
    samples: list[tuple[float, int]] = []
    async with new_session(limit=4) as probe:
        idle_before = await settled(probe, origin, pid)
        started = time.monotonic()
        stop_at = started + seconds
        counter = iter(range(10**9))

        async def client(session: aiohttp.ClientSession) -> None:
            while time.monotonic() < stop_at:
                n = next(counter)
                stream = n % 3 != 0
                model = "soak-tiny" if n % 4 == 0 else "soak"  # a quarter need compaction
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
            start = await snapshot(probe, origin, pid)
            while time.monotonic() < stop_at:
                samples.append((time.monotonic() - started, rss_bytes(pid)))
                await asyncio.sleep(min(5.0, max(0.5, stop_at - time.monotonic())))
            end = await snapshot(probe, origin, pid)
            await asyncio.gather(*workers)
        elapsed = time.monotonic() - started
        await asyncio.sleep(1)
        idle_after = await settled(probe, origin, pid)
    return SoakResult(elapsed, outcome, start, end, idle_before, idle_after, samples)


# -- running it from the command line ------------------------------------------------------------


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
def running_stack(workdir: Path) -> Iterator[tuple[str, int]]:
    """The slow upstream and one gateway worker on loopback; yields (gateway origin, its pid)."""
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
            yield f"http://127.0.0.1:{port}", gateway.popen.pid
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
    with (
        tempfile.TemporaryDirectory(prefix="soak-") as tmp,
        running_stack(Path(tmp)) as (origin, pid),
    ):
        print(f"gateway {origin} pid {pid}", flush=True)
        if args.command in ("all", "burst"):
            result = await burst(
                origin, pid, streams=args.streams, chunks=args.chunks, interval=args.interval
            )
            print(result.report(), flush=True)
            failures += result.failures()
        if args.command in ("all", "soak"):
            outcome = await soak(
                origin, pid, seconds=args.minutes * 60, concurrency=args.concurrency
            )
            print(outcome.report(), flush=True)
            failures += outcome.failures()
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
