"""The signing key of refs (gateway/store/secret.py) against a real redis-server: configured
first, else created once with set-if-absent and read by every later replica, written back when
the store loses it, and a replica holding another key says so (log and metric)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import redis

from gateway.ops.metrics import Metrics
from gateway.store import open_store, signing_key
from gateway.store import secret as secret_module
from tests.conftest import Starter
from tests.redis_server import RedisServer, free_port, start_redis


@pytest.fixture(scope="module")
def redis_server(start_process_session: Starter) -> RedisServer:
    return start_redis(start_process_session)


def flush(server: RedisServer) -> None:
    with redis.Redis(port=server.port) as client:
        client.flushall()


def mismatch(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("compactgate_signing_key_mismatch")


async def test_configured_first_then_per_process_for_memory() -> None:
    metrics = Metrics()
    store = open_store("memory://", metrics)
    assert (await signing_key("s3cret", "memory://", store, metrics)).value == b"s3cret"
    one = await signing_key(None, "memory://", store, metrics)
    two = await signing_key(None, "memory://", store, metrics)
    assert one.source == two.source == "process"
    assert one.value != two.value


async def test_first_replica_creates_the_key_and_later_ones_read_it(
    redis_server: RedisServer,
) -> None:
    flush(redis_server)
    keys = []
    for _ in range(3):
        metrics = Metrics()
        store = open_store(redis_server.url, metrics)
        keys.append(await signing_key(None, redis_server.url, store, metrics))
        await store.close()
    assert [k.source for k in keys] == ["created", "store", "store"]
    assert len({k.value for k in keys}) == 1
    with redis.Redis(port=redis_server.port) as client:
        assert client.get("compactgate:ref-secret") == keys[0].value


async def test_a_key_lost_by_the_store_is_written_back(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    flush(redis_server)
    metrics = Metrics()
    store = open_store(redis_server.url, metrics)
    store._check_s = 0.05  # the check's period, short for the test
    key = await signing_key(None, redis_server.url, store, metrics)
    try:
        assert await store.get("anything") is None  # the first call starts the watch
        flush(redis_server)
        with caplog.at_level(logging.WARNING, logger="compactgate.store"):
            deadline = time.monotonic() + 3
            while redis.Redis(port=redis_server.port).get("compactgate:ref-secret") is None:
                assert time.monotonic() < deadline, "the key was not written back"
                await asyncio.sleep(0.02)
        assert redis.Redis(port=redis_server.port).get("compactgate:ref-secret") == key.value
        assert store.epoch >= 1  # the store was found emptied: what it held lately is forgotten
        assert any("written back" in r.getMessage() for r in caplog.records)
        later = Metrics()
        other = open_store(redis_server.url, later)
        assert await signing_key(None, redis_server.url, other, later) == (
            secret_module.SigningKey(key.value, "store")
        )
        await other.close()
        assert mismatch(metrics) == 0
    finally:
        await store.close()


async def test_a_replica_finding_another_key_says_so(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    flush(redis_server)
    metrics = Metrics()
    store = open_store(redis_server.url, metrics)
    store._check_s = 0.05
    await signing_key(None, redis_server.url, store, metrics)
    try:
        with caplog.at_level(logging.WARNING, logger="compactgate.store"):
            redis.Redis(port=redis_server.port).set("compactgate:ref-secret", b"another replica's")
            assert await store.get("anything") is None
            deadline = time.monotonic() + 3
            while mismatch(metrics) != 1:
                assert time.monotonic() < deadline, "the other key went unnoticed"
                await asyncio.sleep(0.02)
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "other than this process's" in errors[0].getMessage()
    finally:
        await store.close()


async def test_a_store_away_at_start_up_leaves_a_key_of_its_own_quickly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    metrics = Metrics()
    started = time.monotonic()
    store = open_store(url, metrics)
    with caplog.at_level(logging.WARNING, logger="compactgate.store"):
        key = await signing_key(None, url, store, metrics)
    await store.close()
    assert key.source == "process"
    assert time.monotonic() - started < secret_module.STARTUP_WAIT_S + 1.5
    assert any("unreachable at start-up" in r.getMessage() for r in caplog.records)
