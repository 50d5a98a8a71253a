"""Closed-loop load generator: one aiohttp session, keep-alive pool, `concurrency` workers.

Each worker sends a request, waits for the whole answer, and sends the next, until `requests`
have been sent or `max_seconds` have passed (whichever first; both always bounded). Measured per
request: total latency and, when streaming, the time to the first body byte; per batch: the
throughput, errors, and the CPU time (user + system, from /proc/<pid>/stat) the target's process
tree spent, divided by the requests it answered.

`run_paired` is the same at concurrency 1 for several targets at once, one request to each in
turn, so that machine load hits them alike. A request counts as an error unless its status is
200 and, when streaming, the end of its body holds the API's last event (`Target.stream_end`:
`data: [DONE]` for chat, `response.completed` for Responses, `message_stop` for Messages).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TAIL = 16_384  # bytes of a stream's end kept to look for its last event
BodyFor = Callable[[int], bytes]
HeadersFor = Callable[[int], Mapping[str, str]]


@dataclass
class Batch:
    """What one run of the load generator measured."""

    latencies: list[float] = field(default_factory=list)  # seconds, whole answer
    ttfb: list[float] = field(default_factory=list)  # seconds, first body byte (streaming only)
    errors: int = 0
    sent: int = 0  # request indices used (answered or not)
    elapsed: float = 0.0
    cpu_seconds: float = 0.0  # the target's process tree
    first_error: str = ""
    sample_headers: dict[str, str] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.latencies)

    def merge(self, other: Batch) -> None:
        self.latencies += other.latencies
        self.ttfb += other.ttfb
        self.errors += other.errors
        self.sent += other.sent
        self.elapsed += other.elapsed
        self.cpu_seconds += other.cpu_seconds
        self.first_error = self.first_error or other.first_error
        self.sample_headers = other.sample_headers or self.sample_headers


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on sorted values; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:
            return [int(p) for p in file.read().split()]
    except OSError:
        return []


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (bounded walk)."""
    found, todo = [], [pid]
    while todo and len(found) < 256:
        current = todo.pop()
        found.append(current)
        todo += _children(current)
    return found


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of `pids` and their descendants, from /proc."""
    total = 0
    for root in pids:
        for pid in process_tree(root):
            try:
                with open(f"/proc/{pid}/stat", "rb") as file:
                    fields = file.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / _TICKS


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` and its descendants, from /proc/<pid>/statm."""
    total = 0
    for child in process_tree(pid):
        try:
            with open(f"/proc/{child}/statm") as file:
                total += int(file.read().split()[1]) * _PAGE
        except OSError:
            continue
    return total


def new_session(max_concurrency: int = 32) -> aiohttp.ClientSession:
    """The one client session of a run: keep-alive, up to `max_concurrency` connections a target."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=max(1, max_concurrency))
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=120),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    )


@dataclass(frozen=True)
class Target:
    """Where and what to send: request `i` is `body_for(i)` with `headers` and `headers_for(i)`
    added."""

    url: str
    body_for: BodyFor
    headers_for: HeadersFor | None = None
    pids: Sequence[int] = ()  # the target's processes, for CPU time
    headers: Mapping[str, str] | None = None  # the API's own, e.g. `anthropic-version`
    stream_end: bytes = b"data: [DONE]"  # what the end of a complete stream holds


async def _one(
    session: aiohttp.ClientSession,
    target: Target,
    index: int,
    batch: Batch,
    stream: bool,
    base_headers: Mapping[str, str],
) -> None:
    """Send request `index` to `target`, wait for the whole answer, record it in `batch`."""
    headers_for = target.headers_for
    if target.headers:
        base_headers = {**base_headers, **target.headers}
    headers = base_headers if headers_for is None else {**base_headers, **headers_for(index)}
    body = target.body_for(index)
    started = time.perf_counter()
    first = 0.0
    ok = False
    problem = ""
    try:
        async with session.post(target.url, data=body, headers=headers) as response:
            if stream:
                chunk = await response.content.readany()
                first = time.perf_counter()
                tail = chunk
                for _ in range(100_000):
                    chunk = await response.content.readany()
                    if not chunk:
                        break
                    tail = tail[-_TAIL:] + chunk
                ok = response.status == 200 and target.stream_end in tail[-_TAIL:]
                if not ok:
                    problem = f"{response.status}: {tail[-200:]!r}"
            else:
                data = await response.read()
                ok = response.status == 200
                if not ok:
                    problem = f"{response.status}: {data[:300]!r}"
            if not batch.sample_headers:
                batch.sample_headers = {
                    k.lower(): v
                    for k, v in response.headers.items()
                    if k.lower().startswith("x-compactgate")
                }
    except (aiohttp.ClientError, TimeoutError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    ended = time.perf_counter()
    if ok:
        batch.latencies.append(ended - started)
        if stream:
            batch.ttfb.append(first - started)
    else:
        batch.errors += 1
        batch.first_error = batch.first_error or problem


def _headers(authorization: str) -> dict[str, str]:
    return {"content-type": "application/json", "authorization": authorization}


async def run(
    session: aiohttp.ClientSession,
    target: Target,
    *,
    stream: bool,
    concurrency: int,
    requests: int,
    max_seconds: float,
    first_index: int = 0,
    authorization: str = "Bearer sk-bench",
) -> Batch:
    """Send `requests` requests (or stop after `max_seconds`) with `concurrency` in flight,
    numbered from `first_index`."""
    batch = Batch()
    base_headers = _headers(authorization)
    next_index = first_index
    last_index = first_index + requests
    deadline = time.perf_counter() + max_seconds

    async def worker() -> None:
        nonlocal next_index
        while next_index < last_index and time.perf_counter() < deadline:
            index = next_index
            next_index += 1
            await _one(session, target, index, batch, stream, base_headers)

    cpu_before = cpu_seconds(target.pids)
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    batch.elapsed = time.perf_counter() - started
    batch.sent = next_index - first_index
    batch.cpu_seconds = cpu_seconds(target.pids) - cpu_before
    return batch


async def run_paired(
    session: aiohttp.ClientSession,
    targets: Sequence[Target],
    *,
    stream: bool,
    requests: int,
    max_seconds: float,
    first_index: int = 0,
    authorization: str = "Bearer sk-bench",
) -> list[Batch]:
    """One request at a time, to each target in turn (the order rotating), `requests` per
    target or until `max_seconds`: every target sees the same moments of machine load.

    Target k's n-th request is numbered `first_index + n * len(targets) + k` (no two share a
    number, so first-time conversations stay first-time even when targets share a process).
    CPU time is read around each request, so targets served by one process are told apart.
    """
    count = len(targets)
    batches = [Batch() for _ in targets]
    base_headers = _headers(authorization)
    deadline = time.perf_counter() + max_seconds
    sent = 0
    for n in range(requests):
        if time.perf_counter() > deadline:
            break
        for step in range(count):
            k = (n + step) % count
            target, batch = targets[k], batches[k]
            cpu_before = cpu_seconds(target.pids)
            started = time.perf_counter()
            await _one(session, target, first_index + n * count + k, batch, stream, base_headers)
            batch.elapsed += time.perf_counter() - started
            batch.cpu_seconds += cpu_seconds(target.pids) - cpu_before
        sent += 1
    for batch in batches:
        batch.sent = sent * count  # numbers used, counted for the whole group
    return batches
