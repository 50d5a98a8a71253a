"""Fault injection (design D10, D11): an upstream that hangs or hangs up; one answer, in time.

The fake upstream, a process of its own, hangs before its headers or in the middle of a stream,
or drops the connection in the middle of a stream. Whatever it does, each client request gets
exactly one response, in time: the gateway maps timeouts to 504, never retries what has begun
to reach the client, and once a stream has begun it ends it with an SSE error event. All the
while, requests to a healthy upstream through the same gateway keep succeeding.

Why these stay real processes (design D19.7): each depends on a real socket or on real time.
The timeouts (first byte, stream idle, total) are clocks running against an upstream that
really stalls; a stream broken off half-way is seen only by a client reading chunks as they
arrive, and the in-process layer hands an answer over whole (tests/in_process.py). Everything
decided before the first byte reaches the client (retries of 429, 5xx, refused connections and
drops before the headers, `Retry-After`, an empty 200) is tested in process, in
tests/test_upstream_retry.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.chat_seen import MESSAGES, Seen, assert_completed, assert_error
from tests.conftest import GatewayProcess, Starter, fake_upstream_process
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process

FIRST_BYTE_TIMEOUT = 1.5
IDLE_TIMEOUT = 1.0
TOTAL_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def healthy_upstream(start_module_process: Starter) -> Iterator[FakeUpstream]:
    """A second fake upstream that always behaves: the traffic that must not notice the faults."""
    yield from fake_upstream_process(start_module_process)


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream,
    healthy_upstream: FakeUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    retry = {"max_attempts": 3, "backoff_base_seconds": 0.05, "max_delay_seconds": 2}
    config = {
        "server": {
            "connect_timeout_s": 1,
            "first_byte_timeout_s": FIRST_BYTE_TIMEOUT,
            "stream_idle_timeout_s": IDLE_TIMEOUT,
            "upstream_timeout_s": TOTAL_TIMEOUT,
        },
        "models": [
            {
                "name": "flaky",
                "upstream": {"base_url": fake_upstream_server.base_url},
                "context_window": 8000,
                "retry": retry,
            },
            {
                "name": "healthy",
                "upstream": {"base_url": healthy_upstream.base_url},
                "context_window": 8000,
            },
        ],
    }
    with gateway_process(config, tmp_path_factory.mktemp("faults")) as gateway:
        yield gateway


# -- what the client saw ---------------------------------------------------------------------------


def call(gateway: GatewayProcess, model: str, stream: bool = False) -> Seen:
    body = {"model": model, "messages": MESSAGES, "stream": stream}
    started = time.monotonic()
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body, timeout=30) as r:
        data = r.read()
    return Seen(r.status_code, r.headers, data, time.monotonic() - started)


def assert_stream_broken_off(seen: Seen) -> None:
    """Headers were sent, then the upstream failed: the stream ends with one SSE error event."""
    assert seen.status == 200
    assert seen.headers["content-type"].startswith("text/event-stream")
    events = seen.events()
    assert "[DONE]" not in events
    errors = [e for e in events if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and events[-1] is errors[0]
    assert errors[0]["error"]["message"]
    assert len(events) >= 2, "the chunks sent before the failure were relayed"


def while_healthy_traffic(gateway: GatewayProcess, fault: Callable[[], Seen]) -> Seen:
    """Run `fault` while healthy requests go through the same gateway; all must succeed."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(fault)
        time.sleep(0.2)  # the faulty request is in flight (retrying, hanging ...)
        for stream in (False, True, False):
            seen = call(gateway, "healthy", stream=stream)
            assert_completed(seen, stream)
            assert seen.seconds < 2, "a healthy request waited on the faulty one"
        return pending.result(timeout=30)


# -- the faults ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_hang_before_headers_is_504_within_the_first_byte_timeout(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, stream: bool
) -> None:
    fake_upstream.script([{"kind": "hang_before_headers", "seconds": 20}])
    seen = while_healthy_traffic(gateway, lambda: call(gateway, "flaky", stream))
    assert_error(seen, 504, "upstream_timeout")
    assert FIRST_BYTE_TIMEOUT - 0.1 <= seen.seconds < FIRST_BYTE_TIMEOUT + 2
    assert len(fake_upstream.chat_requests()) == 1  # a timeout is not retried
    assert fake_upstream.wait_idle()["inflight"] == 0  # and the hung upstream call was dropped


@pytest.mark.slow
def test_hang_mid_stream_ends_the_stream_with_an_error_event(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script([{"kind": "hang_mid_stream", "after_chunks": 2, "seconds": 20}])
    seen = while_healthy_traffic(gateway, lambda: call(gateway, "flaky", stream=True))
    assert_stream_broken_off(seen)
    assert seen.events()[-1]["error"]["code"] == "upstream_timeout"
    assert IDLE_TIMEOUT - 0.1 <= seen.seconds < IDLE_TIMEOUT + 2
    assert len(fake_upstream.chat_requests()) == 1
    assert fake_upstream.wait_idle()["inflight"] == 0


@pytest.mark.slow
def test_hang_mid_body_is_504_within_the_total_timeout(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script([{"kind": "hang_mid_stream", "after_chunks": 1, "seconds": 20}])
    seen = while_healthy_traffic(gateway, lambda: call(gateway, "flaky"))
    assert_error(seen, 504, "upstream_timeout")
    assert seen.seconds < TOTAL_TIMEOUT + 2


def test_drop_mid_stream_is_not_retried_and_ends_with_an_error_event(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script([{"kind": "drop_mid_stream", "after_chunks": 2}, {"kind": "ok"}])
    seen = while_healthy_traffic(gateway, lambda: call(gateway, "flaky", stream=True))
    assert_stream_broken_off(seen)
    assert len(fake_upstream.chat_requests()) == 1  # bytes reached the client: no retry
    assert seen.seconds < 3


@pytest.mark.slow
def test_the_openai_client_sees_a_stream_broken_off_as_an_error(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """What an SDK user sees when a stream stalls after its first chunks: a typed error, never
    a stream that just ends (its retries and a dead upstream: tests/test_upstream_retry.py)."""
    client = openai.OpenAI(base_url=gateway.base_url, api_key="sk-x", max_retries=0, timeout=30)
    with client:
        fake_upstream.script([{"kind": "hang_mid_stream", "after_chunks": 2, "seconds": 20}])
        stream = client.chat.completions.create(model="flaky", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError):
            for _ in stream:
                pass
