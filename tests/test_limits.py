"""Per-tenant concurrency (gateway/http/limits.py, design D16.2) against a real gateway process.

What a user would notice: a tenant with `max_concurrent_per_tenant` requests in flight gets an
immediate 429 with `Retry-After` (the official client raises `RateLimitError`) and nothing is sent
upstream for it; another tenant is not affected; the slot comes back when a response ends, also
when the client hangs up mid-stream or the upstream fails.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import openai
import pytest

from gateway.errors import TooManyRequestsError
from gateway.http.limits import ConcurrencyLimits
from tests.conftest import GatewayProcess
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process

SMALL = [{"role": "user", "content": "Say hi."}]
LIMIT = 2


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    config = {
        "server": {"max_concurrent_per_tenant": LIMIT},
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": fake_upstream_server.base_url},
                "context_window": 100_000,
                "retry": {"max_attempts": 1},
            }
        ],
    }
    with gateway_process(config, tmp_path_factory.mktemp("limits")) as gw:
        yield gw


def client(gw: GatewayProcess, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


async def wait_upstream_inflight(fake: FakeUpstream, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while fake.inflight()["inflight"] < count:
        assert time.monotonic() < deadline, fake.inflight()
        await asyncio.sleep(0.02)


async def read_stream(api: openai.AsyncOpenAI) -> str:
    stream = await api.chat.completions.create(model="m", messages=SMALL, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


@pytest.mark.slow
async def test_beyond_the_limit_is_429_with_retry_after_and_other_tenants_are_not_affected(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script([{"kind": "slow_stream", "chunks": 15, "interval": 0.1}] * LIMIT)
    one, two = client(gateway, "sk-tenant-one"), client(gateway, "sk-tenant-two")
    streams = [asyncio.create_task(read_stream(one)) for _ in range(LIMIT)]
    await wait_upstream_inflight(fake_upstream, LIMIT)

    with pytest.raises(openai.RateLimitError) as info:
        await one.chat.completions.create(model="m", messages=SMALL)
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "1"
    assert info.value.body["code"] == "too_many_concurrent_requests"
    assert info.value.body["type"] == "rate_limit_error"
    assert fake_upstream.inflight()["started"] == LIMIT  # nothing went upstream for it

    other = await two.chat.completions.create(model="m", messages=SMALL)  # not affected
    assert other.choices[0].message.content

    texts = await asyncio.gather(*streams)
    assert all(t.strip() for t in texts)  # the streams in flight were not disturbed
    assert (await one.chat.completions.create(model="m", messages=SMALL)).choices  # slot is back
    await one.close()
    await two.close()


async def test_a_client_hanging_up_gives_its_slot_back(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script([{"kind": "slow_stream", "chunks": 100, "interval": 0.1}] * LIMIT)
    api = client(gateway, "sk-hangs-up")
    for _ in range(LIMIT):
        stream = await api.chat.completions.create(model="m", messages=SMALL, stream=True)
        await stream.__anext__()  # the stream is flowing ...
        await stream.response.aclose()  # ... and the client hangs up
    deadline = time.monotonic() + 10
    while fake_upstream.inflight()["cancelled"] < LIMIT:
        assert time.monotonic() < deadline, fake_upstream.inflight()
        await asyncio.sleep(0.05)
    for _ in range(LIMIT + 1):  # every slot is free again
        assert (await api.chat.completions.create(model="m", messages=SMALL)).choices
    await api.close()


async def test_failed_requests_give_their_slot_back(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    error = {
        "error": {
            "message": "upstream says no",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    fake_upstream.script(
        [{"kind": "error", "status": 500, "body": error}] * 3 + [{"kind": "drop"}] * 2
    )
    api = client(gateway, "sk-fails")
    for status in (500, 500, 500, 502, 502):
        with pytest.raises(openai.APIStatusError) as info:
            await api.chat.completions.create(model="m", messages=SMALL)
        assert info.value.status_code == status
    results = await asyncio.gather(
        *(api.chat.completions.create(model="m", messages=SMALL) for _ in range(LIMIT))
    )
    assert all(r.choices for r in results)
    await api.close()


def test_limits_unit() -> None:
    limits = ConcurrencyLimits(1)
    with limits.hold("a"):
        assert limits.active("a") == 1
        with pytest.raises(TooManyRequestsError) as info, limits.hold("a"):
            pass
        assert info.value.status == 429 and info.value.headers == {"Retry-After": "1"}
        with limits.hold("b"):
            assert limits.tenants == 2
    assert limits.tenants == 0  # no entry left behind for idle tenants
    with pytest.raises(RuntimeError), limits.hold("a"):
        raise RuntimeError
    assert limits.active("a") == 0
    unlimited = ConcurrencyLimits(None)
    with unlimited.hold("a"), unlimited.hold("a"):
        assert unlimited.tenants == 0
