"""The stores (gateway/store/): memory bounds, LRU and expiry; Redis against a real server;
an outage degrades to "no cache" without an exception."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from gateway.ops.metrics import Metrics
from gateway.store import (
    ENTRY_OVERHEAD,
    MemoryStore,
    RedisStore,
    SafeStore,
    StoreError,
    memory_max_bytes,
    open_store,
)
from tests.conftest import Starter
from tests.redis_server import RedisServer, free_port, start_redis


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store_errors(metrics: Metrics, op: str) -> float:
    value = metrics.registry.get_sample_value("compactgate_store_errors_total", {"op": op})
    return value or 0.0


# -- memory ----------------------------------------------------------------------------------


async def test_memory_get_put_delete() -> None:
    store = MemoryStore()
    assert await store.get("a") is None
    await store.put("a", b"one", None)
    assert await store.get("a") == b"one"
    await store.put("a", b"two", None)
    assert await store.get("a") == b"two"
    assert len(store) == 1
    await store.delete("a")
    assert await store.get("a") is None
    assert store.held == 0


async def test_memory_is_bounded_by_bytes_and_evicts_least_recently_used() -> None:
    entry = ENTRY_OVERHEAD + 1 + 100
    store = MemoryStore(max_bytes=3 * entry)
    for key in "abc":
        await store.put(key, b"x" * 100, None)
    assert store.held == 3 * entry
    assert await store.get("a") == b"x" * 100  # a is now the most recently used
    await store.put("d", b"x" * 100, None)
    assert store.held <= store.max_bytes
    assert await store.get("b") is None  # b was the least recently used
    assert [await store.get(k) is not None for k in "acd"] == [True, True, True]


async def test_memory_drops_a_value_larger_than_the_whole_store() -> None:
    store = MemoryStore(max_bytes=1000)
    await store.put("small", b"s", None)
    await store.put("big", b"x" * 2000, None)
    assert await store.get("big") is None
    assert await store.get("small") == b"s"


async def test_memory_expiry() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    await store.put("k", b"v", 10)
    await store.put("forever", b"v", None)
    clock.now += 9.9
    assert await store.get("k") == b"v"
    clock.now += 0.2
    assert await store.get("k") is None
    assert await store.get("forever") == b"v"
    assert store.held == ENTRY_OVERHEAD + len("forever") + 1


async def test_memory_lock_is_exclusive_until_released_or_expired() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    first = await store.lock("L", 5)
    assert first is not None
    assert await store.lock("L", 5) is None
    await store.release(first)
    second = await store.lock("L", 5)
    assert second is not None
    clock.now += 6
    third = await store.lock("L", 5)  # the holder took too long: its lock expired
    assert third is not None
    await store.release(second)  # a stale holder cannot release the new holder's lock
    assert await store.lock("L", 5) is None


async def test_memory_incr_keeps_the_first_expiry() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    assert await store.incr("n", 10) == 1
    clock.now += 5
    assert await store.incr("n", 10) == 2
    assert await store.get("n") == b"2"
    clock.now += 6
    assert await store.incr("n", 10) == 1


def test_memory_url_options() -> None:
    assert memory_max_bytes("memory://") == 64 * 1024 * 1024
    assert memory_max_bytes("memory://?max_bytes=1000") == 1000
    with pytest.raises(ValueError, match="max_bytes"):
        memory_max_bytes("memory://?max_bytes=lots")
    with pytest.raises(ValueError, match="max_bytes"):
        memory_max_bytes("memory://?max_bytes=0")
    store = open_store("memory://?max_bytes=4096", Metrics())
    assert isinstance(store.backend, MemoryStore) and store.backend.max_bytes == 4096


# -- redis -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(start_process_session: Starter) -> RedisServer:
    return start_redis(start_process_session)


async def test_redis_get_put_delete_expiry(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url)
    try:
        assert await store.get("t1:a") is None
        await store.put("t1:a", b"\x00bytes\xff", None)
        assert await store.get("t1:a") == b"\x00bytes\xff"
        await store.put("t1:short", b"v", 0.2)
        assert await store.get("t1:short") == b"v"
        await asyncio.sleep(0.35)
        assert await store.get("t1:short") is None
        await store.delete("t1:a")
        assert await store.get("t1:a") is None
    finally:
        await store.close()


async def test_redis_values_are_shared_between_clients(redis_server: RedisServer) -> None:
    one, two = RedisStore(redis_server.url), RedisStore(redis_server.url)
    try:
        await one.put("t2:k", b"from one", 30)
        assert await two.get("t2:k") == b"from one"
    finally:
        await one.close()
        await two.close()


async def test_redis_lock_single_holder_expiry_and_safe_release(redis_server: RedisServer) -> None:
    one, two = RedisStore(redis_server.url), RedisStore(redis_server.url)
    try:
        held = await one.lock("t3:L", 0.3)
        assert held is not None
        assert await two.lock("t3:L", 0.3) is None
        await asyncio.sleep(0.45)
        taken = await two.lock("t3:L", 5)  # expired: another replica may take it
        assert taken is not None
        await one.release(held)  # the old token no longer matches: nothing happens
        assert await one.lock("t3:L", 5) is None
        await two.release(taken)
        assert await one.lock("t3:L", 5) is not None
    finally:
        await one.close()
        await two.close()


async def test_redis_lock_races_have_one_winner(redis_server: RedisServer) -> None:
    stores = [RedisStore(redis_server.url) for _ in range(8)]
    try:
        results = await asyncio.gather(*(s.lock("t4:L", 5) for s in stores))
        assert sum(r is not None for r in results) == 1
    finally:
        for store in stores:
            await store.close()


async def test_redis_incr(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url)
    try:
        assert await store.incr("t5:n", 0.3) == 1
        assert await store.incr("t5:n", 0.3) == 2
        await asyncio.sleep(0.45)
        assert await store.incr("t5:n", None) == 1
    finally:
        await store.close()


async def test_redis_unreachable_raises_store_error_quickly() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    try:
        with pytest.raises(StoreError):
            await store.get("k")
    finally:
        await store.close()
    assert time.monotonic() - started < 2


# -- set-if-absent, touch, counters -----------------------------------------------------------


async def test_memory_put_new_and_touch_many() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    assert await store.put_new("k", b"first", None) is None  # it held nothing: now b"first"
    assert await store.put_new("k", b"second", None) == b"first"
    assert await store.get("k") == b"first"
    await store.put("t", b"v", 10)
    clock.now += 8
    assert await store.touch_many(["t", "gone"], 10) == [True, False]
    clock.now += 8  # 16 s after the put, 8 after the touch: the touch renewed the expiry
    assert await store.get("t") == b"v"
    assert await store.get("gone") is None


async def test_redis_put_new_touch_many_and_incr(redis_server: RedisServer) -> None:
    one, two = RedisStore(redis_server.url), RedisStore(redis_server.url)
    try:
        results = await asyncio.gather(
            *(s.put_new("t6:k", b"%d" % i, None) for i, s in enumerate([one, two]))
        )
        assert sorted(r is None for r in results) == [False, True]  # one set it, one read it
        winner = await one.get("t6:k")
        assert [r for r in results if r is not None] == [winner]
        await one.put("t6:short", b"v", 0.3)
        assert await two.touch_many(["t6:short", "t6:none"], 5) == [True, False]
        await asyncio.sleep(0.45)  # past the first expiry, within the renewed one
        assert await one.get("t6:short") == b"v"
        assert await one.touch_many(["t6:short"], None) == [True]
        assert await one.incr("t6:n", 0.3) == 1
        assert await two.incr("t6:n", 0.3) == 2
        await asyncio.sleep(0.45)
        assert await one.incr("t6:n", None) == 1
    finally:
        await one.close()
        await two.close()


# -- outage: degraded, counted, logged, never raised; back within a probe --------------------


async def wait_for(condition: Any, timeout: float) -> float:
    """Seconds until `condition()` holds (polled every 10 ms); AssertionError after `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_outage_degrades_to_no_cache_and_recovers_within_a_second(
    start_process: Starter, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_redis(start_process)
    metrics = Metrics()
    store = open_store(server.url, metrics)
    try:
        assert await store.put("k", b"v", 60) is True
        assert await store.get("k") == b"v"
        epoch = store.epoch
        server.stop()
        with caplog.at_level(logging.WARNING, logger="compactgate.store"):
            started = time.monotonic()
            assert await store.get("k") is None
            assert await store.put("k", b"w", 60) is False  # down: not even tried
            lock = await store.lock("L", 5)
            assert lock is not None and not lock.shared  # local stand-in: the work goes on
            await store.release(lock)
            assert await store.incr("n", None) is None
            assert await store.delete("k") is False
            assert await store.touch_many(["k"], 5) is None
            assert time.monotonic() - started < 2
            assert not store.reachable
            assert metrics.registry.get_sample_value("compactgate_store_reachable") == 0
            await asyncio.sleep(0.6)  # the probe keeps failing meanwhile: still one log line
        assert store_errors(metrics, "get") == 1
        assert store_errors(metrics, "put") == 1
        assert store_errors(metrics, "lock") == 1
        outage_lines = [r for r in caplog.records if "store unavailable" in r.getMessage()]
        assert len(outage_lines) == 1

        # Back on the same port: the probe finds it without any request asking.
        again = start_redis(start_process, port=server.port)
        back = await wait_for(lambda: store.reachable, 3.0)
        print(f"store reachable again {back:.2f} s after redis-server said it was ready")
        assert store.epoch == epoch + 1
        assert await store.put("k", b"back", 60) is True
        assert await store.get("k") == b"back"
        assert metrics.registry.get_sample_value("compactgate_store_reachable") == 1
        again.stop()
    finally:
        await store.close()


async def test_a_restart_between_two_calls_is_not_an_outage(start_process: Starter) -> None:
    """A pooled connection to a server that has restarted since is retried once on a new one."""
    server = start_redis(start_process)
    metrics = Metrics()
    store = open_store(server.url, metrics)
    try:
        assert await store.put("k", b"v", 60) is True
        server.stop()
        again = start_redis(start_process, port=server.port)
        assert await store.get("k") is None  # restarted empty, and reached at once
        assert store.reachable
        assert await store.put("k", b"w", 60) is True
        assert store_errors(metrics, "get") == 0
        again.stop()
    finally:
        await store.close()


async def test_while_down_calls_never_reach_the_backend_and_the_probe_ends_the_outage() -> None:
    metrics = Metrics()

    class Flaky(MemoryStore):
        broken = True
        calls = 0
        pings = 0
        resets = 0

        async def get(self, key: str) -> bytes | None:
            Flaky.calls += 1
            if Flaky.broken:
                raise StoreError("down")
            return await super().get(key)

        async def ping(self) -> None:
            Flaky.pings += 1
            if Flaky.broken:
                raise StoreError("down")

        async def reset(self) -> None:
            Flaky.resets += 1

    store = SafeStore(Flaky(), metrics, shared=True, probe_s=0.05)
    try:
        assert await store.get("a") is None
        for _ in range(20):
            assert await store.get("a") is None  # down: the backend is not asked
        assert Flaky.calls == 1
        await asyncio.sleep(0.3)
        assert Flaky.pings >= 3  # the probe asks instead
        assert Flaky.resets == 1  # old connections dropped once, when the outage began
        assert store_errors(metrics, "get") == 21
        Flaky.broken = False
        await wait_for(lambda: store.reachable, 1.0)
        assert await store.get("a") is None
        assert Flaky.calls == 2
        assert store.epoch == 1
    finally:
        await store.close()
