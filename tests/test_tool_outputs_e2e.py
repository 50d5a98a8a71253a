"""Masked tool output stays readable (design D13.4): the gateway answers its own tools.

A fake upstream plays a model that calls `tool_output_cache` / `tool_output_cache_grep` on a
ref; the client (official openai SDK) must only ever see the final answer, and the model must
have been given the real, line-numbered text.

In-process (tests/in_process.py, a gateway app per test), but for two replica processes sharing a
real Redis.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import GatewayProcess, GatewayStarter
from tests.fake_upstream import FakeUpstream
from tests.in_process import AppGateway, AppStarter, LocalUpstream

LOG_LINES = [
    f"2026-11-21 12:{i // 60:02d}:{i % 60:02d} INFO worker-{i % 7} handled job {i}"
    for i in range(400)
]
LOG_LINES[123] = "2026-11-21 12:02:03 ERROR worker-4 disk full on /var/data"


def history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an ops agent."}]
    for t in range(3):
        messages += [
            {"role": "user", "content": f"step {t}: read the log"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{t}",
                        "type": "function",
                        "function": {"name": "read_log", "arguments": "{}"},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": f"call_{t}",
                "content": "\n".join(LOG_LINES) if t == 0 else f"short output {t}",
            },
            {"role": "assistant", "content": f"done {t}"},
        ]
    messages.append({"role": "user", "content": "Which worker failed, and why?"})
    return messages


CLIENT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "read_log", "parameters": {"type": "object", "properties": {}}},
    }
]


def config_for(upstream: FakeUpstream | LocalUpstream, **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": upstream.base_url},
                "context_window": 6000,
                "max_output_tokens": 300,
                "tokenizer": "chars:4",
                "policy": "p",
            }
        ],
        "policies": {
            "p": {
                "steps": [
                    {"type": "tool_output_cache", "context_budget_tokens": 500},
                    {"type": "fifo"},
                ]
            }
        },
    }


@pytest.fixture
async def gateway(start_app: AppStarter, local_upstream: LocalUpstream) -> AppGateway:
    return await start_app(config_for(local_upstream))


def ref_in(plan: dict[str, Any]) -> str:
    [tool] = [m for m in plan["messages"] if m.get("tool_call_id") == "call_0"]
    assert tool["content"].startswith("[tool output")
    return tool["content"].split("ref=")[1].split("]")[0].split(":")[0]


def plan_body() -> dict[str, Any]:
    return {"model": "m", "messages": history(), "tools": CLIENT_TOOLS}


async def masked_ref(gw: AppGateway, key: str = "sk-tenant-a") -> str:
    """The ref the gateway gives the big log, read from the plan (same tenant, same process)."""
    plan = await gw.http.post(
        f"{gw.base_url}/compactgate/plan",
        json=plan_body(),
        headers={"authorization": f"Bearer {key}"},
    )
    return ref_in(plan.json())


def masked_ref_of_process(gw: GatewayProcess, key: str = "sk-tenant-a") -> str:
    """masked_ref, from a gateway process."""
    plan = httpx.post(
        f"{gw.base_url}/compactgate/plan",
        json=plan_body(),
        headers={"authorization": f"Bearer {key}"},
        timeout=20,
    )
    return ref_in(plan.json())


def internal_call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "kind": "tool_calls",
        "tool_calls": [{"id": "call_internal", "function": {"name": name, "arguments": arguments}}],
    }


def client(gw: GatewayProcess, key: str = "sk-tenant-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def app_client(gw: AppGateway, key: str = "sk-tenant-a") -> openai.AsyncOpenAI:
    return gw.openai(api_key=key, timeout=30)


def tool_results(request: dict[str, Any]) -> list[str]:
    return [
        m["content"]
        for m in request["json"]["messages"]
        if m.get("role") == "tool" and m["tool_call_id"] == "call_internal"
    ]


async def test_model_reads_a_masked_output_and_client_sees_only_the_answer(
    gateway: AppGateway, local_upstream: LocalUpstream
) -> None:
    ref = await masked_ref(gateway)
    local_upstream.script(
        [
            internal_call("tool_output_cache", ref_id=ref, offset=120, limit=5),
            {"kind": "ok", "content": "worker-4: disk full"},
        ]
    )
    raw = await app_client(gateway).chat.completions.with_raw_response.create(
        model="m", messages=history(), tools=CLIENT_TOOLS
    )
    answer = raw.parse()
    assert answer.choices[0].message.content == "worker-4: disk full"
    assert not answer.choices[0].message.tool_calls
    assert raw.headers["x-compactgate-internal-rounds"] == "1"
    assert "tool_output_cache" in raw.headers["x-compactgate-steps"]
    first, second = local_upstream.chat_requests()
    names = [t["function"]["name"] for t in first["json"]["tools"]]
    assert names == ["read_log", "tool_output_cache", "tool_output_cache_grep"]
    assert any(
        "tool_output_cache" in (m.get("content") or "")
        for m in first["json"]["messages"]
        if m["role"] == "system"
    )
    [result] = tool_results(second)
    assert f"   123\t{LOG_LINES[122]}" in result and f"   124\t{LOG_LINES[123]}" in result
    assert "lines 120-124 of 400" in result
    # usage is the sum over both upstream rounds
    assert answer.usage.prompt_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


async def test_grep_finds_a_known_line(gateway: AppGateway, local_upstream: LocalUpstream) -> None:
    ref = await masked_ref(gateway)
    local_upstream.script(
        [
            internal_call(
                "tool_output_cache_grep", ref_id=ref, pattern="ERROR|disk full", context=1
            ),
            {"kind": "ok", "content": "found it"},
        ]
    )
    answer = await app_client(gateway).chat.completions.create(
        model="m", messages=history(), tools=CLIENT_TOOLS
    )
    assert answer.choices[0].message.content == "found it"
    [result] = tool_results(local_upstream.chat_requests()[1])
    assert "1 matching lines of 400" in result
    assert (
        f"   124\t{LOG_LINES[123]}" in result
        and f"   123\t{LOG_LINES[122]}" in result
        and f"   125\t{LOG_LINES[124]}" in result
    )


async def test_streaming_holds_back_internal_calls(
    gateway: AppGateway, local_upstream: LocalUpstream
) -> None:
    ref = await masked_ref(gateway)
    local_upstream.script(
        [
            internal_call("tool_output_cache", ref_id=ref, limit=3),
            {"kind": "ok", "content": "streamed final answer"},
        ]
    )
    stream = await app_client(gateway).chat.completions.create(
        model="m", messages=history(), tools=CLIENT_TOOLS, stream=True
    )
    text, calls = "", []
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            calls += chunk.choices[0].delta.tool_calls or []
    assert text == "streamed final answer" and calls == []
    assert "lines 1-3 of 400" in tool_results(local_upstream.chat_requests()[1])[0]


async def test_streaming_client_tool_call_is_relayed_at_once(
    gateway: AppGateway, local_upstream: LocalUpstream
) -> None:
    await masked_ref(gateway)
    local_upstream.script(
        [
            {
                "kind": "tool_calls",
                "tool_calls": [
                    {"id": "call_client", "function": {"name": "read_log", "arguments": {}}}
                ],
            }
        ]
    )
    stream = await app_client(gateway).chat.completions.create(
        model="m", messages=history(), tools=CLIENT_TOOLS, stream=True
    )
    names = [
        c.function.name
        async for chunk in stream
        if chunk.choices
        for c in (chunk.choices[0].delta.tool_calls or [])
        if c.function and c.function.name
    ]
    assert names == ["read_log"]
    assert len(local_upstream.chat_requests()) == 1


async def test_bad_refs_offsets_and_patterns_are_explained_to_the_model(
    gateway: AppGateway, local_upstream: LocalUpstream
) -> None:
    ref = await masked_ref(gateway)
    cases = [
        (internal_call("tool_output_cache", ref_id="ref_doesnotexist"), "unknown ref_id"),
        (internal_call("tool_output_cache", ref_id=ref, offset=9999), "past the end"),
        (
            internal_call("tool_output_cache_grep", ref_id=ref, pattern="(unclosed"),
            "invalid pattern",
        ),
        (
            {
                "kind": "tool_calls",
                "tool_calls": [
                    {
                        "id": "call_internal",
                        "function": {"name": "tool_output_cache", "arguments": "{not json"},
                    }
                ],
            },
            "not valid JSON",
        ),
    ]
    for call, expected in cases:
        local_upstream.reset()
        local_upstream.script([call, {"kind": "ok", "content": "ok"}])
        answer = await app_client(gateway).chat.completions.create(
            model="m", messages=history(), tools=CLIENT_TOOLS
        )
        assert answer.choices[0].message.content == "ok"
        [result] = tool_results(local_upstream.chat_requests()[1])
        assert expected in result, result


async def test_a_ref_of_tenant_a_is_unknown_to_tenant_b(
    gateway: AppGateway, local_upstream: LocalUpstream
) -> None:
    ref_a = await masked_ref(gateway, "sk-tenant-a")
    await app_client(gateway, "sk-tenant-a").chat.completions.create(
        model="m", messages=history(), tools=CLIENT_TOOLS
    )  # stores it
    local_upstream.reset()
    local_upstream.script(
        [internal_call("tool_output_cache", ref_id=ref_a), {"kind": "ok", "content": "b"}]
    )
    await app_client(gateway, "sk-tenant-b").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}, *history()[1:]], tools=CLIENT_TOOLS
    )
    [result] = tool_results(local_upstream.chat_requests()[1])
    assert "unknown ref_id" in result and "disk full" not in result
    assert await masked_ref(gateway, "sk-tenant-b") != ref_a  # refs are per tenant too


async def test_rounds_are_bounded_and_leftover_internal_calls_are_hidden(
    gateway: AppGateway, local_upstream: LocalUpstream
) -> None:
    ref = await masked_ref(gateway)
    local_upstream.script([internal_call("tool_output_cache", ref_id=ref, limit=1)] * 6)
    answer = await app_client(gateway).chat.completions.with_raw_response.create(
        model="m", messages=history(), tools=CLIENT_TOOLS
    )
    assert answer.headers["x-compactgate-internal-rounds"] == "4"
    assert len(local_upstream.chat_requests()) == 5
    assert not answer.parse().choices[0].message.tool_calls


async def test_internal_rounds_add_their_usage_and_a_refused_round_is_passed_on(
    gateway: AppGateway, local_upstream: LocalUpstream
) -> None:
    ref = await masked_ref(gateway)
    call = internal_call("tool_output_cache", ref_id=ref, limit=1)
    local_upstream.script(
        [
            {**call, "prompt_tokens": 1000, "completion_tokens": 20},
            {"kind": "ok", "content": "done", "prompt_tokens": 3000, "completion_tokens": 5},
        ]
    )
    answer = await app_client(gateway).chat.completions.create(
        model="m", messages=history(), tools=CLIENT_TOOLS
    )
    assert answer.usage is not None
    usage = (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens)
    assert usage == (4000, 25, 4025)
    refusal = {"error": {"type": "invalid_request_error", "message": "no more today"}}
    local_upstream.script([call, {"kind": "error", "status": 400, "body": refusal}])
    with pytest.raises(openai.BadRequestError) as refused:
        await app_client(gateway).chat.completions.create(
            model="m", messages=history(), tools=CLIENT_TOOLS
        )
    assert refused.value.response.json() == refusal


async def test_no_expansion_tools_when_nothing_was_masked(
    gateway: AppGateway, local_upstream: LocalUpstream
) -> None:
    await app_client(gateway).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=CLIENT_TOOLS
    )
    [sent] = local_upstream.chat_requests()
    assert [t["function"]["name"] for t in sent["json"]["tools"]] == ["read_log"]
    assert json.dumps(sent["json"]).count("tool_output_cache") == 0


@pytest.mark.slow
def test_with_redis_a_ref_stored_by_one_replica_expands_through_another(
    start_gateway: GatewayStarter, start_process: Any, fake_upstream: FakeUpstream
) -> None:
    from tests.redis_server import start_redis

    redis = start_redis(start_process)
    config = config_for(fake_upstream, store=redis.url)
    replica_a, replica_b = start_gateway(config), start_gateway(config)
    ref = masked_ref_of_process(replica_a)
    assert (
        masked_ref_of_process(replica_b) == ref
    )  # same secret on both: the forwarded prefix is identical
    client(replica_a).chat.completions.create(
        model="m", messages=history(), tools=CLIENT_TOOLS
    )  # A stores it
    # B never saw the log: its own request masks a different output, and the model asks for A's ref.
    other = [
        m if m.get("tool_call_id") != "call_0" else {**m, "content": "other output line\n" * 1200}
        for m in history()
    ]
    fake_upstream.reset()
    fake_upstream.script(
        [
            internal_call("tool_output_cache_grep", ref_id=ref, pattern="disk full"),
            {"kind": "ok", "content": "via b"},
        ]
    )
    answer = client(replica_b).chat.completions.create(
        model="m", messages=other, tools=CLIENT_TOOLS
    )
    assert answer.choices[0].message.content == "via b"
    [result] = tool_results(fake_upstream.chat_requests()[1])
    assert LOG_LINES[123] in result
