"""Returning freed heap memory once a worker is idle (gateway/ops/memory.py).

What an operator would notice: after a peak, a worker with nothing in flight gives the heap
memory it freed back to the system within a few seconds, never while a request is being served,
and does nothing on a C library other than glibc. The RSS figures (before and after, 500 streams)
come from `python -m benchmarks.soak burst`; benchmarks/test_soak_short.py holds a short burst
to a bound on what RSS keeps.
"""

from __future__ import annotations

import asyncio
import gc
import pickle
import platform
import time

import httpx
import pytest

from gateway.ops.memory import YOUNG_THRESHOLD, GlibcMalloc, IdleTrim
from tests.conftest import GatewayStarter
from tests.in_process import AppStarter

MiB = 1024 * 1024


class FakeMalloc:
    def __init__(self, free: int = 10 * MiB) -> None:
        self.free = free
        self.trims = 0

    def free_bytes(self) -> int:
        return self.free

    def trim(self) -> None:
        self.trims += 1


def started(malloc: FakeMalloc, threshold: int = MiB) -> IdleTrim:
    trim = IdleTrim(interval=3600, threshold=threshold, malloc=malloc)
    loop = asyncio.new_event_loop()
    try:
        trim.start(loop, set())
    finally:
        loop.close()
    return trim


def test_trims_only_when_idle_and_enough_has_been_freed_since_the_last_trim() -> None:
    malloc = FakeMalloc(free=10 * MiB)
    trim = started(malloc)
    assert not trim.check(idle=True)  # nothing freed since the start
    malloc.free = 4 * MiB  # a peak: memory in use
    assert not trim.check(idle=False)
    malloc.free = 12 * MiB  # ... given back: 8 MiB above the lowest point
    assert not trim.check(idle=False)  # a request is in flight: later
    assert trim.check(idle=True) and malloc.trims == 1
    assert not trim.check(idle=True)  # once per peak, not on every idle check
    malloc.free = 12 * MiB + MiB // 2
    assert not trim.check(idle=True)  # under the threshold
    malloc.free = 13 * MiB
    assert trim.check(idle=True) and malloc.trims == 2


def test_checks_run_on_the_loop_with_the_requests_in_flight() -> None:
    malloc = FakeMalloc(free=0)
    trim = IdleTrim(interval=0.01, threshold=MiB, malloc=malloc)
    in_flight: set[object] = {"a request"}

    async def scenario() -> None:
        trim.start(asyncio.get_running_loop(), in_flight)
        trim.start(asyncio.get_running_loop(), in_flight)  # later connections: no second timer
        malloc.free = 5 * MiB
        await asyncio.sleep(0.1)
        assert malloc.trims == 0  # busy
        in_flight.clear()
        await asyncio.sleep(0.1)
        assert malloc.trims == 1

    asyncio.run(scenario())


def test_an_idle_trim_pickles_into_workers_until_it_has_started() -> None:
    fresh = IdleTrim(malloc=FakeMalloc())
    copy = pickle.loads(pickle.dumps(fresh))
    assert copy.interval == fresh.interval and copy._malloc is None  # loads its own libc
    with pytest.raises(TypeError):
        pickle.dumps(started(FakeMalloc()))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_is_found_and_answers() -> None:
    malloc = GlibcMalloc.load()
    assert malloc is not None
    assert malloc.free_bytes() >= 0
    malloc.trim()


def test_without_glibc_nothing_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert GlibcMalloc.load() is None
    trim = IdleTrim(interval=0.01)

    async def scenario() -> None:
        trim.start(asyncio.get_running_loop(), set())
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert trim.trims == 0


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_the_gateway_trims_once_idle_after_large_requests(start_gateway: GatewayStarter) -> None:
    gw = start_gateway(
        {
            "models": [
                {
                    "name": "m",
                    "upstream": {"base_url": "http://127.0.0.1:9/v1"},
                    "context_window": 10_000_000,
                    "tokenizer": "chars:4",
                }
            ]
        },
        args=("--log-level", "debug"),
    )
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * (3 * MiB)}]}
    with httpx.Client(timeout=30) as client:
        for _ in range(4):  # plan: parsed and counted, nothing sent upstream
            assert client.post(f"{gw.base_url}/compactgate/plan", json=big).status_code == 200
    deadline = time.monotonic() + 20
    while "returned free heap memory" not in gw.output() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "returned free heap memory to the system" in gw.output()


async def test_start_up_objects_are_left_out_of_later_collections(start_app: AppStarter) -> None:
    """After start-up, a full collection walks only what was made since (gateway/ops/memory.py).

    Without it, each full collection while serving walked the ~130,000 objects of the imported
    modules: 82-102 ms stalls of whichever request was in flight, measured with gc callbacks
    in the gateway during `benchmarks.bench_summaries` (2-3 ms once frozen). This checks the
    lifespan freezes them; the stall itself is a timing, which tests here do not assert.
    """
    gc.collect()  # count the live objects: garbage earlier tests left is collected, not frozen
    before = len(gc.get_objects())
    # The default config, its lifespan run as a server runs it, its collection walking all
    # that is alive (as a served process's walks all of its own).
    gw = await start_app({}, served_gc=True)
    frozen, walked, young = gw.started_gc
    assert frozen >= before * 0.9  # all that start-up left alive (the test process too)
    assert walked < frozen // 10  # a collection now walks a small fraction of that
    assert young == YOUNG_THRESHOLD  # requests in flight are not walked after every request
