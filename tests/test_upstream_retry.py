"""Upstream retries (design D11.3): a failing upstream; the client still gets one answer.

The fake upstream refuses connections, fails with 500s and 429s, drops the connection before
its headers, or answers an empty 200. Whatever it does, each client request gets exactly one
response: the gateway retries what is safe to retry (nothing has reached the client yet), with
backoff and honouring `Retry-After`, maps a dead upstream to 502 and relays the upstream's own
error once attempts run out. All the while, requests to a healthy upstream through the same
gateway keep succeeding.

In process (tests/in_process.py): every decision here is taken before the first byte reaches
the client, so the answer handed over whole shows it all. What needs a socket or a clock on the
gateway's side (hangs, timeouts, a connection dropped mid-stream) is in tests/test_faults.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from tests.chat_seen import ECHO, MESSAGES, Seen, assert_completed, assert_error
from tests.conftest import free_port
from tests.in_process import AppGateway, AppStarter, LocalUpstream

RETRY = {"max_attempts": 3, "backoff_base_seconds": 0.05, "max_delay_seconds": 2}


@dataclass
class Faulty:
    """A gateway whose `flaky` model is on the test's upstream, `dead` on a port nobody listens
    on, and `healthy` on an upstream that always behaves."""

    gw: AppGateway
    upstream: LocalUpstream


async def start(start_app: AppStarter, flaky: LocalUpstream, healthy: LocalUpstream) -> Faulty:
    gw = await start_app(
        {
            "server": {"connect_timeout_s": 1},
            "models": [
                {
                    "name": "flaky",
                    "upstream": {"base_url": flaky.base_url},
                    "context_window": 8000,
                    "retry": RETRY,
                },
                {
                    # No fake upstream there: the gateway's own HTTP client is refused.
                    "name": "dead",
                    "upstream": {"base_url": f"http://127.0.0.1:{free_port()}/v1"},
                    "context_window": 8000,
                    "retry": {**RETRY, "max_attempts": 2},
                },
                {
                    "name": "healthy",
                    "upstream": {"base_url": healthy.base_url},
                    "context_window": 8000,
                },
            ],
        }
    )
    return Faulty(gw, flaky)


@pytest.fixture
async def faulty(start_app: AppStarter, local_upstream: LocalUpstream) -> Any:
    async with LocalUpstream.serve() as healthy:
        yield await start(start_app, local_upstream, healthy)


# -- what the client saw ---------------------------------------------------------------------------


async def call(gw: AppGateway, model: str, stream: bool = False) -> Seen:
    body = {"model": model, "messages": MESSAGES, "stream": stream}
    started = time.monotonic()
    r = await gw.http.post(f"{gw.base_url}/chat/completions", json=body)
    return Seen(r.status_code, r.headers, r.content, time.monotonic() - started)


async def while_healthy_traffic(faulty: Faulty, fault: Awaitable[Seen]) -> Seen:
    """Run `fault` while healthy requests go through the same gateway; all must succeed."""
    pending = asyncio.ensure_future(fault)
    # the faulty request is in flight (retrying ...) before the healthy ones start
    deadline = time.monotonic() + 0.2
    while not faulty.upstream.requests() and not pending.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    for stream in (False, True, False):
        seen = await call(faulty.gw, "healthy", stream=stream)
        assert_completed(seen, stream)
        assert seen.seconds < 2, "a healthy request waited on the faulty one"
    return await asyncio.wait_for(pending, 30)


# -- the faults ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_refused_connection_is_retried_then_502(faulty: Faulty, stream: bool) -> None:
    seen = await while_healthy_traffic(faulty, call(faulty.gw, "dead", stream))
    assert_error(seen, 502, "upstream_unreachable")
    assert seen.seconds < 5
    # Nobody can count the attempts at a port nobody listens on but the gateway itself.
    metrics = (await faulty.gw.http.get("/metrics")).text
    assert 'compactgate_upstream_retries_total{model="dead",reason="connect"} 1.0' in metrics


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_500_twice_then_success_is_retried(faulty: Faulty, stream: bool) -> None:
    error = {
        "kind": "error",
        "status": 500,
        "body": {"error": {"message": "boom", "type": "server_error"}},
    }
    faulty.upstream.script([error, error, {"kind": "ok"}])
    seen = await while_healthy_traffic(faulty, call(faulty.gw, "flaky", stream))
    assert_completed(seen, stream)
    assert len(faulty.upstream.chat_requests()) == 3


async def test_500_until_attempts_run_out_relays_the_upstream_error(faulty: Faulty) -> None:
    error = {
        "kind": "error",
        "status": 503,
        "body": {"error": {"message": "overloaded", "type": "server_error"}},
    }
    faulty.upstream.script([error] * 5)
    seen = await call(faulty.gw, "flaky")
    assert seen.status == 503 and seen.json() == error["body"]
    assert len(faulty.upstream.chat_requests()) == 3  # max_attempts


@pytest.mark.slow
async def test_429_retry_after_is_honoured(faulty: Faulty) -> None:
    limited = {
        "kind": "error",
        "status": 429,
        "headers": {"Retry-After": "1"},
        "body": {"error": {"message": "slow down", "type": "rate_limit_error"}},
    }
    faulty.upstream.script([limited, {"kind": "ok"}])
    seen = await while_healthy_traffic(faulty, call(faulty.gw, "flaky"))
    assert_completed(seen, stream=False)
    first, second = faulty.upstream.chat_requests()
    # The backoff alone would wait at most `backoff_base_seconds` (0.05 s) before attempt 2.
    assert 0.9 <= second["time"] - first["time"] < 2.0
    assert seen.seconds >= 0.9


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_drop_before_headers_is_retried(faulty: Faulty, stream: bool) -> None:
    faulty.upstream.script([{"kind": "drop"}, {"kind": "ok"}])
    seen = await while_healthy_traffic(faulty, call(faulty.gw, "flaky", stream))
    assert_completed(seen, stream)
    assert len(faulty.upstream.chat_requests()) == 2


async def test_an_error_event_that_is_no_context_error_is_relayed_not_retried(
    faulty: Faulty,
) -> None:
    error = {"error": {"message": "The server is overloaded.", "type": "server_error"}}
    faulty.upstream.script([{"kind": "stream_error_event", "body": error}, {"kind": "ok"}])
    seen = await call(faulty.gw, "flaky", stream=True)
    assert seen.status == 200
    assert seen.events() == [error]
    assert seen.headers["x-compactgate-retries"] == "0"
    assert len(faulty.upstream.chat_requests()) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_empty_200_is_never_relayed_silently(faulty: Faulty, stream: bool) -> None:
    # Streaming, an empty 200 may be llama-cpp-python's overflow quirk (test_reactive retries a
    # long conversation); two short messages cannot be made smaller, so the answer is a 502.
    faulty.upstream.script([{"kind": "empty_200"}] * 4)
    seen = await while_healthy_traffic(faulty, call(faulty.gw, "flaky", stream))
    assert_error(seen, 502, "bad_gateway")
    assert len(faulty.upstream.chat_requests()) == 1


async def test_the_openai_client_sees_each_outcome_once(faulty: Faulty) -> None:
    """What an SDK user sees: a completion after retries, a typed error for a dead upstream."""
    client = faulty.gw.openai(api_key="sk-x")
    faulty.upstream.script(
        [
            {"kind": "drop"},
            {"kind": "error", "status": 502, "raw": "bad gateway"},
            {"kind": "ok"},
        ]
    )
    completion = await client.chat.completions.create(model="flaky", messages=MESSAGES)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == ECHO
    assert len(faulty.upstream.chat_requests()) == 3
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model="dead", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.status_code == 502
