"""Recognising the agents' own compaction requests, from requests captured from the real agents.

The fixtures under `tests/fixtures/agents/` were captured from Codex CLI 0.169.0 (its
auto-compaction past `model_auto_compact_token_limit`) and Claude Code 2.1.331 (`/compact`) through
the gateway, and from OpenCode 1.18.33 (its auto-compaction past the model's `limit.context`,
Anthropic provider, captured at the fake upstream); the agents' own instructions and tool
descriptions are replaced by a note of their size, the rest is as sent.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agents.signatures import DEFAULT_SIGNATURES, Signature, recognise
from gateway.config import parse_config
from gateway.wire import CHAT, MESSAGES, RESPONSES
from tests.configs import one_model
from tests.conftest import Starter
from tests.fake_agent_apis import summary_requests
from tests.in_process import AppStarter, LocalUpstream
from tests.redis_server import RedisServer, start_redis
from tests.wire_strategies import messages_bodies, responses_bodies

FIXTURES = Path(__file__).parent / "fixtures" / "agents"


@pytest.fixture(scope="module")
def redis_server(start_process_session: Starter) -> RedisServer:
    return start_redis(start_process_session)


WIRES = {"responses": RESPONSES, "messages": MESSAGES}
WIRE_BY_API = {"chat": CHAT, **WIRES}


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def parsed(api: str, body: dict[str, Any]) -> Any:
    return WIRES[api].parse(orjson.dumps(body), 100_000)


@pytest.mark.parametrize("signature", DEFAULT_SIGNATURES, ids=lambda s: s.name)
def test_every_default_signature_recognises_the_request_it_was_written_from(
    signature: Signature,
) -> None:
    assert signature.fixture is not None
    body = fixture(Path(signature.fixture).name)
    request = parsed(signature.api or ("messages" if "messages" in body else "responses"), body)
    assert recognise(request.api, request.messages) == signature


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_opencodes_prompt_is_its_compaction_whichever_api_its_provider_speaks(api: str) -> None:
    """OpenCode sends the same compaction prompt through any provider."""
    text = fixture("opencode_compaction_request.json")["messages"][-1]["content"][-1]["text"]
    body: dict[str, Any] = {"model": "m"}
    if api == "responses":
        body["input"] = [{"type": "message", "role": "user", "content": text}]
    else:
        body["messages"] = [{"role": "user", "content": text}]
        body["max_tokens"] = 100
    request = WIRE_BY_API[api].parse(orjson.dumps(body), 100_000)
    found = recognise(request.api, request.messages)
    assert found is not None and found.name == "opencode"


@pytest.mark.parametrize(
    ("api", "name"),
    [
        ("responses", "codex_tool_request.json"),
        ("responses", "codex_after_compaction_request.json"),
        ("messages", "claude_tool_request.json"),
        ("messages", "opencode_tool_request.json"),
    ],
)
def test_the_same_agents_ordinary_turns_are_not_compactions(api: str, name: str) -> None:
    """Codex's turn after its compaction carries the summary in a user message; an ordinary
    turn's latest user message is the task or a tool result."""
    request = parsed(api, fixture(name))
    assert recognise(request.api, request.messages) is None


def test_a_compaction_prompt_further_up_the_history_is_not_a_new_request() -> None:
    body = fixture("codex_compaction_request.json")
    body["input"].append({"type": "message", "role": "user", "content": "Continue."})
    request = parsed("responses", body)
    assert recognise(request.api, request.messages) is None


def test_a_signature_names_its_api() -> None:
    """Claude Code's wording sent on the Responses API is not Claude Code compacting."""
    text = fixture("claude_compact_request.json")["messages"][-1]["content"][-1]["text"]
    request = parsed("responses", {"model": "m", "input": [{"role": "user", "content": text}]})
    assert recognise(request.api, request.messages) is None


@settings(max_examples=60, deadline=None)
@given(body=st.one_of(responses_bodies(), messages_bodies()))
def test_generated_agent_sessions_are_never_taken_for_compactions(body: dict[str, Any]) -> None:
    api = "responses" if "input" in body else "messages"
    request = parsed(api, body)
    assert recognise(request.api, request.messages) is None


def test_signatures_are_configurable() -> None:
    config = parse_config(
        {
            "agent_compaction": {
                "signatures": [
                    {"name": "opencode", "starts_with": "Provide a detailed summary for"}
                ]
            }
        }
    )
    [signature] = config.agent_compaction.signatures
    request = parsed(
        "responses",
        {"model": "m", "input": [{"role": "user", "content": "Provide a detailed summary for X"}]},
    )
    assert recognise(request.api, request.messages, config.agent_compaction.signatures) == signature
    assert recognise(request.api, request.messages) is None  # not one of the defaults


async def test_an_agents_compaction_is_forwarded_and_said_so(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(one_model(local_upstream.base_url))
    body = {**fixture("codex_compaction_request.json"), "stream": False}
    response = await gw.http.post(f"{gw.base_url}/responses", json=body)
    assert response.status_code == 200
    assert response.headers["x-compactgate-agent-compaction"] == "codex; forwarded"
    ordinary = {**fixture("codex_tool_request.json"), "stream": False}
    response = await gw.http.post(f"{gw.base_url}/responses", json=ordinary)
    assert "x-compactgate-agent-compaction" not in response.headers
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    assert 'compactgate_agent_compactions_total{agent="codex",outcome="forwarded"} 1.0' in metrics


async def test_opencodes_compaction_is_forwarded_and_nothing_is_prepared_for_it(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """OpenCode sends its history as one transcript inside the prompt: no summary made from
    messages can answer it, so the gateway learns nothing from it and spends nothing ahead."""
    gw = await start_app(
        one_model(local_upstream.base_url, tokenizer="chars:4", context_window=200_000)
    )
    url = f"{gw.base_url}/messages"
    body = {**fixture("opencode_compaction_request.json"), "stream": False}
    response = await gw.http.post(url, headers=KEY, json=body)
    assert response.status_code == 200
    assert response.headers["x-compactgate-agent-compaction"] == "opencode; forwarded"
    ordinary_turn = {**fixture("opencode_tool_request.json"), "stream": False}
    for _ in range(3):  # turns at and above the size it compacted at
        response = await gw.http.post(url, headers=KEY, json=ordinary_turn)
        assert response.status_code == 200
    await asyncio.sleep(0.5)  # room for a background summary, were one started
    assert len(local_upstream.requests()) == 4  # the compaction and three turns, nothing more
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    assert 'compactgate_agent_compactions_total{agent="opencode",outcome="forwarded"} 1.0' in (
        metrics
    )
    assert 'agent="opencode",outcome="prepared"' not in metrics


# -- answered from a summary made ahead of need ---------------------------------------------------

KEY = {"authorization": "Bearer sk-client"}  # one tenant: the SDK's default key in these tests
PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION. Summarise for the next model."


def codex_history(steps: int) -> list[Any]:
    items: list[Any] = [
        {"type": "message", "role": "developer", "content": "You are a coding agent. " * 40},
        {"type": "message", "role": "user", "content": "Fix the build."},
    ]
    for step in range(steps):
        items.append(
            {
                "type": "function_call",
                "call_id": f"c{step}",
                "name": "exec_command",
                "arguments": "{}",
            }
        )
        out = "\n".join(f"line {n} of step {step}: ok" for n in range(60))
        items.append({"type": "function_call_output", "call_id": f"c{step}", "output": out})
    return items


def compaction(items: list[Any], stream: bool = False) -> dict[str, Any]:
    prompt = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": PROMPT}],
    }
    return {"model": "m", "input": [*items, prompt], "tools": [], "stream": stream, "store": False}


def ordinary(items: list[Any]) -> dict[str, Any]:
    return {"model": "m", "input": items, "tools": [], "stream": False, "store": False}


async def test_an_agents_next_compaction_is_answered_from_a_summary_made_ahead(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        one_model(local_upstream.base_url, tokenizer="chars:4", context_window=200_000)
    )
    url = f"{gw.base_url}/responses"
    # The agent's first compaction, at 10 steps: forwarded, the gateway learns where and how.
    first = await gw.http.post(url, headers=KEY, json=compaction(codex_history(10)))
    assert first.headers["x-compactgate-agent-compaction"] == "codex; forwarded"
    # The next history grows; past 70 % of that size the gateway makes the summary itself.
    for steps in range(1, 10):
        response = await gw.http.post(url, headers=KEY, json=ordinary(codex_history(steps)))
        assert response.status_code == 200
    prepared = 'compactgate_agent_compactions_total{agent="codex",outcome="prepared"}'
    for _ in range(200):  # made in the background: at 70 % of that size, again 15 % later
        if f"{prepared} 2.0" in (await gw.http.get(f"{gw.url}/metrics")).text:
            break
        await asyncio.sleep(0.02)
    made = summary_requests(local_upstream.requests())
    assert len(made) == 3  # the agent's own, then the gateway's two ahead of need
    calls = len(local_upstream.requests())
    # The agent compacts one step later: answered at once, without the upstream.
    for stream in (False, True):
        answered = await gw.http.post(url, headers=KEY, json=compaction(codex_history(10), stream))
        assert answered.headers["x-compactgate-agent-compaction"] == "codex; answered"
        assert len(local_upstream.requests()) == calls
    client = gw.openai()
    reply = await client.responses.create(**compaction(codex_history(10)))
    assert reply.output_text.startswith("<summary>SUMMARY of")
    assert "Steps after this summary was written" in reply.output_text  # the last step's tail
    assert "line 59 of step 9" in reply.output_text
    assert reply.usage is not None and reply.usage.input_tokens == 0  # nothing billed
    streamed = {k: v for k, v in compaction(codex_history(10)).items() if k != "stream"}
    async with client.responses.stream(**streamed) as events:
        assert (await events.get_final_response()).output_text == reply.output_text
    # Much more happened since the summary was made: the agent's own call is forwarded.
    late = await gw.http.post(url, headers=KEY, json=compaction(codex_history(16)))
    assert late.headers["x-compactgate-agent-compaction"] == "codex; forwarded"
    assert len(local_upstream.requests()) == calls + 1
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    assert 'compactgate_agent_compactions_total{agent="codex",outcome="answered"} 4.0' in metrics


def codex_model(upstream: LocalUpstream, store: str = "memory://") -> dict[str, Any]:
    model = one_model(upstream.base_url, tokenizer="chars:4", context_window=200_000)
    return {"store": store, **model}


async def agent_events(gw: Any) -> list[dict[str, Any]]:
    feed = (await gw.http.get(f"{gw.base_url}/compactgate/events")).json()["events"]
    return [e for e in feed if e.get("agent_compaction")]


async def prepare_ahead(gw: Any, upstream: LocalUpstream) -> None:
    """The agent compacts once at 10 steps (forwarded: the gateway learns where and how), then
    a new history grows to 9 steps and the gateway makes the next summary in the background
    (waited for after each step, so the test does not depend on how fast it comes)."""
    url = f"{gw.base_url}/responses"
    await gw.http.post(url, headers=KEY, json=compaction(codex_history(10)))
    metric = 'compactgate_agent_compactions_total{agent="codex",outcome="prepared"}'

    async def prepared() -> float:
        text = (await gw.http.get(f"{gw.url}/metrics")).text
        kept = [line for line in text.splitlines() if line.startswith(metric)]
        return float(kept[0].rsplit(" ", 1)[1]) if kept else 0.0

    for steps in range(1, 10):
        response = await gw.http.post(url, headers=KEY, json=ordinary(codex_history(steps)))
        assert response.status_code == 200
        for _ in range(300):  # every summary asked for so far is made and kept
            await asyncio.sleep(0.02)
            if len(summary_requests(upstream.requests())) - 1 == await prepared():
                break
    assert await prepared() == 2.0  # at 70 % of the agent's size, again 15 % later


async def test_every_agent_compaction_gets_one_event_saying_what_happened_and_why(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Forwarded because nothing was ready, answered from a ready summary, forwarded because
    the summary is stale: one event-log line each, and none carries the conversation."""
    gw = await start_app(codex_model(local_upstream))
    await prepare_ahead(gw, local_upstream)
    url = f"{gw.base_url}/responses"
    answered = await gw.http.post(url, headers=KEY, json=compaction(codex_history(10)))
    assert answered.headers["x-compactgate-agent-compaction"] == "codex; answered"
    late = await gw.http.post(url, headers=KEY, json=compaction(codex_history(16)))
    assert late.headers["x-compactgate-agent-compaction"] == "codex; forwarded"

    events = await agent_events(gw)
    assert [(e["agent_outcome"], e["agent_reason"]) for e in events] == [
        ("forwarded", "not_ready"),
        ("answered", "ready"),
        ("forwarded", "stale"),
    ]
    assert all(e["agent_compaction"] == "codex" and e["status"] == 200 for e in events)
    logged = orjson.dumps(events).decode()
    assert "line 0 of step" not in logged and "CONTEXT CHECKPOINT" not in logged


async def test_a_summary_made_on_one_replica_answers_the_compaction_on_another(
    start_app: AppStarter, local_upstream: LocalUpstream, redis_server: RedisServer
) -> None:
    """Two gateways sharing one Redis: the one that saw the history made the summary; the
    agent's compaction request lands on the other, which answers it without the upstream."""
    first = await start_app(codex_model(local_upstream, redis_server.url))
    second = await start_app(codex_model(local_upstream, redis_server.url))
    await prepare_ahead(first, local_upstream)
    calls = len(local_upstream.requests())
    summaries = len(summary_requests(local_upstream.requests()))

    url = f"{second.base_url}/responses"
    for stream in (False, True):
        answer = await second.http.post(
            url, headers=KEY, json=compaction(codex_history(10), stream)
        )
        assert answer.status_code == 200
        assert answer.headers["x-compactgate-agent-compaction"] == "codex; answered"
    reply = await second.openai().responses.create(**compaction(codex_history(10)))
    assert reply.output_text.startswith("<summary>SUMMARY of")
    assert "line 59 of step 9" in reply.output_text  # the step the summary did not cover

    assert len(local_upstream.requests()) == calls  # no call at all, summary or otherwise
    assert len(summary_requests(local_upstream.requests())) == summaries
    [*_, event] = await agent_events(second)
    assert (event["agent_outcome"], event["agent_reason"]) == ("answered", "ready")
    # Another tenant's identical history is not answered from this tenant's summary.
    other = await second.http.post(
        url, headers={"authorization": "Bearer sk-other"}, json=compaction(codex_history(10))
    )
    assert other.headers["x-compactgate-agent-compaction"] == "codex; forwarded"


async def test_the_replica_the_agents_turns_land_on_prepares_what_another_replica_learnt(
    start_app: AppStarter, local_upstream: LocalUpstream, redis_server: RedisServer
) -> None:
    """The agent's first compaction lands on one replica, its ordinary turns on the other: the
    other still prepares the next summary ahead of need, and answers the next compaction."""
    learner = await start_app(codex_model(local_upstream, redis_server.url))
    worker = await start_app(codex_model(local_upstream, redis_server.url))
    key = {"authorization": "Bearer sk-replicas"}  # a tenant no other test used on this Redis
    first = await learner.http.post(
        f"{learner.base_url}/responses", headers=key, json=compaction(codex_history(10))
    )
    assert first.headers["x-compactgate-agent-compaction"] == "codex; forwarded"
    metric = 'compactgate_agent_compactions_total{agent="codex",outcome="prepared"}'
    url = f"{worker.base_url}/responses"
    for steps in range(1, 10):
        response = await worker.http.post(url, headers=key, json=ordinary(codex_history(steps)))
        assert response.status_code == 200
        for _ in range(300):  # the template fetched, and any summary asked for made
            await asyncio.sleep(0.02)
            metrics = (await worker.http.get(f"{worker.url}/metrics")).text
            if steps < 8 or metric in metrics:
                break
    assert metric in (await worker.http.get(f"{worker.url}/metrics")).text
    calls = len(local_upstream.requests())
    answer = await worker.http.post(url, headers=key, json=compaction(codex_history(10)))
    assert answer.headers["x-compactgate-agent-compaction"] == "codex; answered"
    assert len(local_upstream.requests()) == calls
