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
CODEX = 'compactgate_agent_compactions_total{agent="codex",outcome="%s"}'


def codex_history(
    steps: int, task: str = "Fix the build.", lines: int = 60, result: str = "ok"
) -> list[Any]:
    """A Codex-like history: instructions, the task, then `steps` shell calls and outputs
    (`lines` lines the last step's, each line ending in `result`)."""
    items: list[Any] = [
        {"type": "message", "role": "developer", "content": "You are a coding agent. " * 40},
        {"type": "message", "role": "user", "content": task},
    ]
    for step in range(steps):
        items.append(
            {
                "type": "function_call",
                "call_id": f"c{step}",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": f"make step{step}"}),
            }
        )
        count = lines if step == steps - 1 else 60
        out = "\n".join(f"line {n} of step {step}: {result}" for n in range(count))
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


def codex_model(upstream: LocalUpstream, store: str = "memory://") -> dict[str, Any]:
    model = one_model(upstream.base_url, tokenizer="chars:4", context_window=200_000)
    return {"store": store, **model}


async def agent_events(gw: Any) -> list[dict[str, Any]]:
    feed = (await gw.http.get(f"{gw.base_url}/compactgate/events")).json()["events"]
    return [e for e in feed if e.get("agent_compaction")]


async def metric(gw: Any, series: str) -> float:
    text = (await gw.http.get(f"{gw.url}/metrics")).text
    kept = [line for line in text.splitlines() if line.startswith(series + " ")]
    return float(kept[0].rsplit(" ", 1)[1]) if kept else 0.0


async def settled(gw: Any, upstream: LocalUpstream) -> None:
    """Every summary the gateway started ahead of need has been made and kept (each summary
    request the upstream got is a forwarded compaction or one the gateway prepared)."""
    await asyncio.sleep(0.05)
    for _ in range(300):
        made = len(summary_requests(upstream.requests()))
        if made == await metric(gw, CODEX % "forwarded") + await metric(gw, CODEX % "prepared"):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("a summary made ahead of need never finished")


async def turns(
    gw: Any,
    upstream: LocalUpstream,
    steps: range,
    task: str = "Fix the build.",
    key: Any = KEY,
    result: str = "ok",
) -> None:
    """The agent's ordinary turns, one per step, each given time for what it starts."""
    for step in steps:
        history = codex_history(step, task, result=result)
        response = await gw.http.post(
            f"{gw.base_url}/responses", headers=key, json=ordinary(history)
        )
        assert response.status_code == 200
        await settled(gw, upstream)


async def learn(gw: Any, upstream: LocalUpstream, key: Any = KEY) -> None:
    """The agent's first session: its turns to 9 steps, then its own compaction at 10, which
    is forwarded and teaches the gateway how and where this agent compacts."""
    await turns(gw, upstream, range(1, 10), key=key)
    first = await gw.http.post(
        f"{gw.base_url}/responses", headers=key, json=compaction(codex_history(10))
    )
    assert first.headers["x-compactgate-agent-compaction"] == "codex; forwarded"


async def test_an_agents_next_compaction_is_answered_from_a_summary_made_one_step_ahead(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(codex_model(local_upstream))
    url = f"{gw.base_url}/responses"
    await learn(gw, local_upstream)
    await turns(gw, local_upstream, range(1, 10))  # the next session grows the same way
    made = summary_requests(local_upstream.requests())
    # One summary ahead: after the turn whose next step reaches where the agent compacts.
    assert len(made) == 2  # the agent's own, then the gateway's
    assert len(made[-1]["json"]["input"]) == len(codex_history(9)) + 1  # 9 steps, the prompt
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
    assert '{"cmd": "make step9"}' in reply.output_text  # its call, as made
    assert "line 0 of step 9" in reply.output_text and "line 59 of step 9" in reply.output_text
    assert "line 30 of step 9" not in reply.output_text  # its output's middle left out
    assert reply.usage is not None and reply.usage.input_tokens == 0  # nothing billed
    streamed = {k: v for k, v in compaction(codex_history(10)).items() if k != "stream"}
    async with client.responses.stream(**streamed) as events:
        assert (await events.get_final_response()).output_text == reply.output_text
    # Far more happened since the summary than it covers: the agent's own call is forwarded.
    late = await gw.http.post(url, headers=KEY, json=compaction(codex_history(30)))
    assert late.headers["x-compactgate-agent-compaction"] == "codex; forwarded"
    assert len(local_upstream.requests()) == calls + 1
    assert await metric(gw, CODEX % "answered") == 4.0


async def test_a_summary_covering_most_of_the_history_answers_with_its_tail_written_short(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """The summary covers 20 of 23 items; the uncovered step printed a third of the history:
    the answer keeps that step's call and its output's first and last lines, and is a small
    fraction of the history it replaces (issue 40: such a request was forwarded as stale)."""
    gw = await start_app(codex_model(local_upstream))
    await learn(gw, local_upstream)
    await turns(gw, local_upstream, range(1, 10))
    history = codex_history(10, lines=300)
    response = await gw.http.post(f"{gw.base_url}/responses", headers=KEY, json=compaction(history))
    assert response.headers["x-compactgate-agent-compaction"] == "codex; answered"
    text = response.json()["output"][0]["content"][0]["text"]
    assert '{"cmd": "make step9"}' in text
    assert "line 0 of step 9" in text and "line 299 of step 9" in text
    assert "line 150 of step 9" not in text and "lines (" in text  # says what it left out
    before = int(response.headers["x-compactgate-tokens-before"])
    after = int(response.headers["x-compactgate-tokens-after"])
    assert 0 < after < before / 5  # the answer the agent keeps, against what it sent


async def test_a_summary_still_being_made_is_waited_for_not_made_again(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """The model takes a while to summarise and the agent compacts right after its turn: the
    compaction waits for the summary under way and is answered from it; the upstream is asked
    for one summary, not two."""
    gw = await start_app(codex_model(local_upstream))
    await learn(gw, local_upstream)
    await turns(gw, local_upstream, range(1, 9))
    local_upstream.configure({"summary_delay_s": 0.5})
    url = f"{gw.base_url}/responses"
    response = await gw.http.post(url, headers=KEY, json=ordinary(codex_history(9)))
    assert response.status_code == 200
    answered = await gw.http.post(url, headers=KEY, json=compaction(codex_history(10)))
    assert answered.headers["x-compactgate-agent-compaction"] == "codex; answered"
    assert len(summary_requests(local_upstream.requests())) == 2  # the agent's first, ours


async def test_each_compaction_gets_its_summary_one_step_ahead_at_the_agents_own_pace(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Cycle after cycle one summary each, made after the turn before the compaction; a
    session whose turns add two steps at a time gets it two steps ahead, not earlier."""
    gw = await start_app(codex_model(local_upstream))
    url = f"{gw.base_url}/responses"
    await learn(gw, local_upstream)
    for cycle in range(3):
        task = f"Fix the build, part {cycle}."
        made = len(summary_requests(local_upstream.requests()))
        await turns(gw, local_upstream, range(1, 10), task)
        assert len(summary_requests(local_upstream.requests())) == made + 1
        answer = await gw.http.post(url, headers=KEY, json=compaction(codex_history(10, task)))
        assert answer.headers["x-compactgate-agent-compaction"] == "codex; answered"
    made = len(summary_requests(local_upstream.requests()))
    await turns(gw, local_upstream, range(1, 10, 2), task="Fix the tests.")
    assert len(summary_requests(local_upstream.requests())) == made + 1
    assert len(summary_requests(local_upstream.requests())[-1]["json"]["input"]) == 21
    answer = await gw.http.post(
        url, headers=KEY, json=compaction(codex_history(11, task="Fix the tests."))
    )
    assert answer.headers["x-compactgate-agent-compaction"] == "codex; answered"
    assert await metric(gw, CODEX % "forwarded") == 1.0  # only the very first


async def test_a_conversation_whose_summaries_go_unused_sits_out_its_next_compaction(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """An agent that rewrites its history before compacting (here: a tool output of its
    first step) never uses the summaries made ahead: after two unused, its next compaction
    gets none (forwarded, `backoff`), and the one after is prepared again."""
    gw = await start_app(codex_model(local_upstream))
    url = f"{gw.base_url}/responses"
    await learn(gw, local_upstream)
    made: list[int] = []
    for cycle in range(4):
        result = f"k{cycle}"  # as long as the first session's "ok"
        before = len(summary_requests(local_upstream.requests()))
        await turns(gw, local_upstream, range(1, 10), result=result)
        made.append(len(summary_requests(local_upstream.requests())) - before)
        history = codex_history(10, result=result)
        history[3] = {**history[3], "output": "rewritten"}
        rewritten = compaction(history)
        answer = await gw.http.post(url, headers=KEY, json=rewritten)
        assert answer.headers["x-compactgate-agent-compaction"] == "codex; forwarded"
    assert made == [1, 1, 0, 1]
    events = await agent_events(gw)
    assert [e["agent_reason"] for e in events] == [
        "not_ready",
        "not_ready",
        "not_ready",
        "backoff",
        "not_ready",
    ]
    figures = events[-1]["agent_conversation"]
    assert figures["summaries_made"] == 3 and figures["summaries_unused"] == 3
    assert figures["forwarded_backoff"] == 1 and figures["answered"] == 0
    assert figures["background_tokens"] > 0 and figures["saved_tokens"] == 0
    assert await metric(gw, 'compactgate_agent_unused_summaries_total{agent="codex"}') == 3.0
    series = 'compactgate_agent_compaction_forwarded_total{agent="codex",reason="backoff"}'
    assert await metric(gw, series) == 1.0


async def test_every_agent_compaction_gets_one_event_saying_what_happened_and_why(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Forwarded because nothing was ready, answered from a ready summary, forwarded because
    the summary is stale: one event-log line each, with the conversation's figures so far and
    the request's real token figures, and none carries the conversation."""
    gw = await start_app(codex_model(local_upstream))
    await learn(gw, local_upstream)
    await turns(gw, local_upstream, range(1, 10))
    url = f"{gw.base_url}/responses"
    answered = await gw.http.post(url, headers=KEY, json=compaction(codex_history(10)))
    assert answered.headers["x-compactgate-agent-compaction"] == "codex; answered"
    late = await gw.http.post(url, headers=KEY, json=compaction(codex_history(30)))
    assert late.headers["x-compactgate-agent-compaction"] == "codex; forwarded"

    events = await agent_events(gw)
    assert [(e["agent_outcome"], e["agent_reason"]) for e in events] == [
        ("forwarded", "not_ready"),
        ("answered", "ready"),
        ("forwarded", "stale"),
    ]
    assert all(e["agent_compaction"] == "codex" and e["status"] == 200 for e in events)
    ready = events[1]
    tokens = int(answered.headers["x-compactgate-tokens-before"])
    assert ready["tokens_before"] == tokens > ready["tokens_after"] > 0
    assert ready["agent_conversation"]["answered"] == 1
    assert ready["agent_conversation"]["saved_tokens"] == tokens
    spent = ready["agent_conversation"]["background_tokens"]
    assert 0 < spent < tokens  # the summary read the history before the last step
    assert events[2]["agent_conversation"]["forwarded_stale"] == 1
    assert await metric(gw, 'compactgate_agent_saved_tokens_total{agent="codex"}') == tokens
    assert await metric(gw, 'compactgate_agent_background_tokens_total{agent="codex"}') == spent
    logged = orjson.dumps(events).decode()
    assert "line 0 of step" not in logged and "CONTEXT CHECKPOINT" not in logged


async def test_an_answered_compaction_reports_the_tokens_it_would_have_sent(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """`x-compactgate-tokens-before` of an answered compaction is what the same request
    forwarded reports; `-after` the answer the agent keeps instead."""
    gw = await start_app(codex_model(local_upstream))
    await learn(gw, local_upstream)
    await turns(gw, local_upstream, range(1, 10))
    url = f"{gw.base_url}/responses"
    body = compaction(codex_history(10))
    answered = await gw.http.post(url, headers=KEY, json=body)
    forwarded = await gw.http.post(url, headers={"authorization": "Bearer sk-other"}, json=body)
    assert answered.headers["x-compactgate-agent-compaction"] == "codex; answered"
    assert forwarded.headers["x-compactgate-agent-compaction"] == "codex; forwarded"
    before = answered.headers["x-compactgate-tokens-before"]
    assert before == forwarded.headers["x-compactgate-tokens-before"]
    assert 0 < int(answered.headers["x-compactgate-tokens-after"]) < int(before) / 2


async def prepare_ahead(gw: Any, upstream: LocalUpstream, key: Any = KEY) -> None:
    """The agent's first compaction (forwarded: the gateway learns how and where), then its
    next session's turns, after the last of which the gateway makes the next summary."""
    await learn(gw, upstream, key)
    await turns(gw, upstream, range(1, 10), key=key)
    assert await metric(gw, CODEX % "prepared") == 1.0


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


def claude_history(steps: int, result: str = "ok") -> list[Any]:
    """A Claude-Code-like conversation: the task, then `steps` Bash calls and their results."""
    messages: list[Any] = [{"role": "user", "content": "Fix the build."}]
    for step in range(steps):
        call = {"type": "tool_use", "id": f"toolu_{step}", "name": "Bash"}
        call["input"] = {"command": f"make step{step}"}
        messages.append({"role": "assistant", "content": [call]})
        out = "\n".join(f"line {n} of step {step}: {result}" for n in range(60))
        block = {"type": "tool_result", "tool_use_id": f"toolu_{step}", "content": out}
        messages.append({"role": "user", "content": [block]})
    return messages


def claude_body(messages: list[Any], compacting: bool = False) -> dict[str, Any]:
    """Claude Code's request; compacting, its prompt joins the turn answering the last call."""
    if compacting:
        prompt = fixture("claude_compact_request.json")["messages"][-1]["content"][-1]
        last = messages[-1]
        messages = [*messages[:-1], {**last, "content": [*last["content"], prompt]}]
    return {"model": "m", "system": "You are Claude Code. " * 40, "messages": messages,
            "max_tokens": 4096, "stream": False}  # fmt: skip


async def test_an_agent_that_compacts_on_the_last_requests_size_gets_one_summary_per_cycle(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Claude Code compacts on the usage of its last request: its compaction carries that
    request's history. The turns before its first compaction already bracket where it comes,
    so from the next cycle on one summary is made, after the turn it follows, and it answers
    the compaction whole (nothing uncovered)."""
    gw = await start_app(codex_model(local_upstream))
    url = f"{gw.base_url}/messages"
    agent = 'compactgate_agent_compactions_total{agent="claude-code",outcome="%s"}'
    for cycle in range(3):
        result = f"k{cycle}"
        made = len(summary_requests(local_upstream.requests()))
        for step in range(1, 10):
            body = claude_body(claude_history(step, result))
            assert (await gw.http.post(url, headers=KEY, json=body)).status_code == 200
            await asyncio.sleep(0.05)
        for _ in range(300):  # what the gateway started has reached the upstream and come back
            asked = len(summary_requests(local_upstream.requests()))
            done = await metric(gw, agent % "prepared") + await metric(gw, agent % "forwarded")
            if asked == done:
                break
            await asyncio.sleep(0.02)
        compacting = claude_body(claude_history(9, result), compacting=True)
        answer = await gw.http.post(url, headers=KEY, json=compacting)
        outcome = answer.headers["x-compactgate-agent-compaction"]
        if cycle == 0:
            assert outcome == "claude-code; forwarded"  # the first teaches
            continue
        assert outcome == "claude-code; answered"
        assert len(summary_requests(local_upstream.requests())) == made + 1
        assert "Steps after this summary" not in answer.json()["content"][0]["text"]


async def test_the_summary_is_made_while_the_turn_before_the_compaction_is_at_the_upstream(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """The turn that will be the last before the agent compacts is still being answered when
    the gateway's summary call reaches the upstream: the model writes both at once, and the
    compaction request, which comes after that turn, finds the summary ready or nearly so."""
    gw = await start_app(codex_model(local_upstream))
    await learn(gw, local_upstream)
    await turns(gw, local_upstream, range(1, 9))
    made = len(summary_requests(local_upstream.requests()))
    local_upstream.script([{"kind": "ok", "delay_s": 2.0}])  # the model takes its time
    body = ordinary(codex_history(9))
    turn = asyncio.create_task(gw.http.post(f"{gw.base_url}/responses", headers=KEY, json=body))
    for _ in range(150):
        if len(summary_requests(local_upstream.requests())) > made:
            break
        await asyncio.sleep(0.01)
    assert len(summary_requests(local_upstream.requests())) == made + 1
    assert not turn.done()  # the turn is still at the upstream
    assert (await turn).status_code == 200
