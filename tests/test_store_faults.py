"""Nothing lost when Redis loses its data (design D13.1, D13.2, D13.4), with real processes.

Gateway replicas from the CLI (`compactgate serve`) share a real `redis-server`; the fake
upstream plays a model that asks to expand a masked tool output, and answers the summary calls
of `/v1/responses/compact`. Mid-session, Redis is emptied (FLUSHALL), then restarted empty:

- the next resend of the conversation stores the masked output again, and its ref expands;
- the gateway uses the store again within about a second of Redis answering (measured: the
  time until `/v1/responses/compact` stops answering 503 `store_unavailable`);
- the signing key is written back, so a replica started afterwards gives the same refs, and a
  compaction item issued by one replica is accepted by the other.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
import redis as redis_client

from tests.conftest import GatewayProcess, GatewayStarter, Starter
from tests.fake_upstream import FakeUpstream
from tests.redis_server import RedisServer, start_redis
from tests.test_remote_compaction import SUMMARY, client_calls, dumped, summary_script
from tests.test_remote_compaction import history as responses_history
from tests.test_tool_outputs_e2e import (
    CLIENT_TOOLS,
    LOG_LINES,
    config_for,
    history,
    internal_call,
    masked_ref_of_process,
    tool_results,
)

pytestmark = pytest.mark.slow


def gateway_config(upstream: FakeUpstream, redis: RedisServer) -> dict[str, Any]:
    return {
        **config_for(upstream, store=redis.url),
        "summaries": {"precompute": False, "retry_failed_after_s": 0},
    }


def expanded_line(gateway: GatewayProcess, upstream: FakeUpstream, ref: str) -> str:
    """The conversation resent through `gateway`, the model asking to grep the masked log by
    `ref`: what the gateway answered the model."""
    upstream.reset()
    upstream.script(
        [
            internal_call("tool_output_cache_grep", ref_id=ref, pattern="disk full"),
            {"kind": "ok", "content": "done"},
        ]
    )
    chat = openai.OpenAI(base_url=gateway.base_url, api_key="sk-tenant-a", max_retries=0)
    answer = chat.chat.completions.create(model="m", messages=history(), tools=CLIENT_TOOLS)
    assert answer.choices[0].message.content == "done"
    [result] = tool_results(upstream.chat_requests()[1])
    return result


def compact_status(gateway: GatewayProcess) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/responses/compact",
        json={"model": "m", "input": responses_history("poll")},
        headers={"authorization": "Bearer sk-tenant-a"},
        timeout=30,
    )


def is_follow_up(items: list[dict[str, Any]]) -> bool:
    """The client's follow-up, not a compaction the gateway prepares ahead of need from it."""
    return items[-1].get("content") in ("Go on.", [{"type": "input_text", "text": "Go on."}])


def held_key(redis: RedisServer) -> bytes | None:
    with redis_client.Redis(port=redis.port) as client:
        value = client.get("compactgate:ref-secret")
    return value if isinstance(value, bytes) else None


def test_redis_emptied_mid_session_loses_nothing(
    start_gateway: GatewayStarter, start_process: Starter, fake_upstream: FakeUpstream
) -> None:
    redis = start_redis(start_process)
    config = gateway_config(fake_upstream, redis)
    first = start_gateway(config)
    ref = masked_ref_of_process(first)
    key = held_key(redis)
    assert key is not None
    assert LOG_LINES[123] in expanded_line(first, fake_upstream, ref)

    # FLUSHALL mid-session: the next resend stores the output again.
    with redis_client.Redis(port=redis.port) as client:
        client.flushall()
    assert LOG_LINES[123] in expanded_line(first, fake_upstream, ref)

    # A restart without data: the store is used again within about a second of answering.
    fake_upstream.reset()
    redis.stop()
    down = time.monotonic()
    while time.monotonic() - down < 4:  # clients keep asking while Redis is away
        assert compact_status(first).status_code == 503
        time.sleep(0.05)
    again = start_redis(start_process, port=redis.port)
    answered = time.monotonic()
    while (status := compact_status(first).status_code) == 503:
        assert time.monotonic() - answered < 10, "the store never came back"
        time.sleep(0.05)
    back = time.monotonic() - answered
    print(f"compact answered {status} {back:.2f} s after redis-server was ready again")
    assert status == 200 and back < 5  # generous: the probe runs every 0.25 s
    assert LOG_LINES[123] in expanded_line(first, fake_upstream, ref)

    # The signing key is written back, so a replica started now signs with the same key.
    deadline = time.monotonic() + 10
    while held_key(again) != key:
        assert time.monotonic() < deadline, "the signing key was not written back"
        time.sleep(0.1)
    second = start_gateway(config)
    assert masked_ref_of_process(second) == ref
    assert LOG_LINES[123] in expanded_line(second, fake_upstream, ref)

    # A compaction item issued by one replica is accepted by the other, both ways.
    for issuer, reader in ((first, second), (second, first)):
        fake_upstream.reset()
        fake_upstream.script([summary_script()])
        issued = openai.OpenAI(base_url=issuer.base_url, api_key="sk-a", max_retries=0)
        compacted = issued.responses.compact(
            model="m", input=responses_history(f"from {issuer.port}")
        )
        follow_up = [*dumped(compacted.output), {"role": "user", "content": "Go on."}]
        read = openai.OpenAI(base_url=reader.base_url, api_key="sk-a", max_retries=0)
        assert read.responses.create(model="m", input=follow_up).output_text == "fake answer"
        [sent] = [r for r in client_calls(fake_upstream) if is_follow_up(r["json"]["input"])]
        assert SUMMARY in str(sent["json"]["input"])
