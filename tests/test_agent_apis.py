"""The Responses and Messages APIs through the gateway, driven by the official SDKs.

In process: the app and the fake upstream (`tests.fake_agent_apis`), which speaks both APIs'
real wire formats and answers 400, as the providers do, to a request that breaks their pairing,
reasoning or signature rules. A tool session that outgrows the window must finish with every
request accepted; the gateway's own errors come in each API's shape; streams are relayed.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.configs import one_model
from tests.fake_agent_apis import (
    messages_body,
    messages_problem,
    prompt_tokens,
    responses_body,
    responses_problem,
)
from tests.in_process import AppGateway, AppStarter, LocalUpstream

WINDOW = 6000
SHELL_RESPONSES = {
    "type": "function",
    "name": "shell",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
SHELL_MESSAGES = {
    "name": "shell",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


def output(step: int) -> str:
    """A tool output of about 700 tokens (chars:4)."""
    return "\n".join(f"src/module_{step}.py:{n}: value = compute({n}, {step})" for n in range(70))


def config(upstream: LocalUpstream, steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    steps = steps or [{"type": "tool_output_cache"}, {"type": "fifo"}]
    model = {"tokenizer": "chars:4", "context_window": WINDOW, "max_output_tokens": 500}
    return one_model(upstream.base_url, steps, **model)


def sizes(upstream: LocalUpstream, path: str) -> list[int]:
    return [
        prompt_tokens(r["json"], 4.0)
        for r in upstream.requests()
        if r["path"] == path and r["json"]
    ]


def shell_call(step: int) -> dict[str, Any]:
    """The fake model's move at `step` of a session: one shell call, with reasoning that must
    come back."""
    call = {"name": "shell", "arguments": {"cmd": f"cat module_{step}.py"}}
    return {"kind": "tool_calls", "reasoning": True, "tool_calls": [call]}


def masked_items() -> list[Any]:
    """A Responses input of twelve large tool outputs: the older ones get masked."""
    items: list[Any] = [{"role": "user", "content": "Investigate."}]
    for step in range(12):
        items.append(
            {"type": "function_call", "call_id": f"c{step}", "name": "shell", "arguments": "{}"}
        )
        items.append(
            {"type": "function_call_output", "call_id": f"c{step}", "output": output(step)}
        )
    return items


def masked_messages() -> list[Any]:
    """The same history as Messages: tool_use and tool_result blocks."""
    messages: list[Any] = [{"role": "user", "content": "Investigate."}]
    for step in range(12):
        use = {"type": "tool_use", "id": f"toolu_{step}", "name": "shell", "input": {}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{step}", "content": output(step)}
        messages.append({"role": "assistant", "content": [use]})
        messages.append({"role": "user", "content": [result]})
    return messages


# -- Responses -------------------------------------------------------------------------------


async def responses_session(
    gw: AppGateway, upstream: LocalUpstream, steps: int, stream: bool
) -> tuple[Any, list[str]]:
    client = gw.openai()
    items: list[Any] = [{"role": "user", "content": "Find and fix the failing test."}]
    seen_steps: list[str] = []
    for step in range(steps):
        upstream.script([shell_call(step)])
        kwargs = {
            "model": "m",
            "instructions": "You are a coding agent.",
            "input": items,
            "tools": [SHELL_RESPONSES],
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
        if stream:
            async with client.responses.stream(**kwargs) as events:
                response = await events.get_final_response()
        else:
            raw = await client.responses.with_raw_response.create(**kwargs)
            seen_steps.append(raw.headers["x-compactgate-steps"])
            response = raw.parse()
        items += [item.model_dump(exclude_none=True) for item in response.output]
        call = next(item for item in response.output if item.type == "function_call")
        items.append(
            {"type": "function_call_output", "call_id": call.call_id, "output": output(step)}
        )
    upstream.script([{"kind": "ok", "content": "Fixed: module_3 divided by zero."}])
    final = await client.responses.create(
        model="m",
        instructions="You are a coding agent.",
        input=items,
        tools=[SHELL_RESPONSES],
        store=False,
    )
    return final, seen_steps


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_responses_tool_session_outgrowing_the_window_finishes(
    start_app: AppStarter, local_upstream: LocalUpstream, stream: bool
) -> None:
    """Twenty tool rounds of ~700 tokens through a 6k window: every request the upstream gets
    keeps each reasoning item with its call and each output with its call (it would refuse
    them otherwise), fits, and the session ends with the model's answer."""
    gw = await start_app(config(local_upstream))
    local_upstream.configure({"context_limit": WINDOW})
    final, seen = await responses_session(gw, local_upstream, 20, stream)
    assert final.output_text == "Fixed: module_3 divided by zero."
    sent = sizes(local_upstream, "/v1/responses")
    assert len(sent) >= 21 and max(sent) <= WINDOW
    last = [r for r in local_upstream.requests() if r["path"] == "/v1/responses"][-1]["json"]
    outputs = [i for i in last["input"] if i.get("type") == "function_call_output"]
    assert any("ref=" in str(i["output"]) for i in outputs)  # old outputs masked
    if not stream:
        assert "tool_output_cache" in ",".join(seen)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_responses_session_learns_a_smaller_upstream_window_after_at_most_two_errors(
    start_app: AppStarter, local_upstream: LocalUpstream, stream: bool
) -> None:
    """Configured for 3x the window the upstream really has, whose errors (the Responses API's)
    state no numbers: the refused request's size teaches the window, so a growing Codex-like
    session costs at most two context errors in all (each retried and answered), and
    /v1/models then says the window the gateway compacts to is below what was configured."""
    configured = 3 * WINDOW
    model = {"tokenizer": "chars:4", "context_window": configured, "max_output_tokens": 500}
    steps = [{"type": "tool_output_cache"}, {"type": "fifo"}]
    gw = await start_app(one_model(local_upstream.base_url, steps, **model))
    local_upstream.configure({"context_limit": WINDOW})
    final, _ = await responses_session(gw, local_upstream, 24, stream)
    assert final.output_text == "Fixed: module_3 divided by zero."
    sent = sizes(local_upstream, "/v1/responses")
    refused = [size for size in sent if size > WINDOW]
    assert 1 <= len(refused) <= 2, sent
    listed = (await gw.http.get(f"{gw.base_url}/models")).json()["data"]
    assert listed[0]["context_window"] < configured


async def test_responses_context_error_is_recovered_and_errors_have_openais_shape(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(config(local_upstream))
    client = gw.openai()
    history = [
        {"role": "user", "content": "question " + "word " * 1500},
        {"role": "assistant", "content": "answer " + "word " * 1500},
        {"role": "user", "content": "and now?"},
    ]
    # The upstream's window is smaller than the gateway thinks: its real error, then the retry.
    local_upstream.script([{"kind": "context_limit", "limit": 2000}])
    reply = await client.responses.create(model="m", input=history)
    assert reply.output_text == "fake answer"
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.create(model="no-such-model", input="hi")
    assert "no-such-model" in missing.value.message
    bad = await gw.http.post(
        f"{gw.base_url}/responses",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert bad.status_code == 400 and set(bad.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }


async def test_a_responses_stream_opening_with_a_context_error_is_retried(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """A stream whose first event is the context error (no numbers, as OpenAI's) is compacted
    and retried before any byte reaches the client. A gateway of its own: after a first
    refusal the gateway has learnt a smaller window and compacts before sending."""
    gw = await start_app(config(local_upstream))
    history = [
        {"role": "user", "content": "question " + "word " * 1500},
        {"role": "assistant", "content": "answer " + "word " * 1500},
        {"role": "user", "content": "and now?"},
    ]
    local_upstream.script([{"kind": "stream_error_event"}])
    async with gw.openai().responses.stream(model="m", input=history) as events:
        assert (await events.get_final_response()).output_text == "fake answer"
    sent = sizes(local_upstream, "/v1/responses")
    assert len(sent) == 2 and sent[1] < sent[0]


async def test_responses_expansion_is_answered_by_the_gateway(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Once outputs are masked, the model may read one back: the gateway answers that call
    itself and the client sees only the final answer, streamed or not."""
    gw = await start_app(config(local_upstream))
    client = gw.openai()
    items = masked_items()
    for stream in (False, True):
        local_upstream.script([{"kind": "expand"}, {"kind": "ok", "content": "Read it: done."}])
        kwargs = {"model": "m", "input": items, "tools": [SHELL_RESPONSES], "store": False}
        if stream:
            async with client.responses.stream(**kwargs) as events:
                final = await events.get_final_response()
        else:
            final = await client.responses.create(**kwargs)
        assert final.output_text == "Read it: done."
        assert all(item.type != "function_call" for item in final.output)
        second = [r for r in local_upstream.requests() if r["path"] == "/v1/responses"][-1]["json"]
        answered = [i for i in second["input"] if i.get("type") == "function_call_output"][-1]
        assert "module_" in str(answered["output"])  # the gateway read the masked output back


# -- Messages -------------------------------------------------------------------------------


async def messages_session(
    gw: AppGateway, upstream: LocalUpstream, steps: int, stream: bool
) -> Any:
    client = gw.anthropic()
    messages: list[Any] = [{"role": "user", "content": "Find and fix the failing test."}]
    for step in range(steps):
        upstream.script([shell_call(step)])
        kwargs = {
            "model": "m",
            "max_tokens": 400,
            "system": [
                {
                    "type": "text",
                    "text": "You are a coding agent.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
            "messages": messages,
            "tools": [SHELL_MESSAGES],
        }
        if stream:
            async with client.messages.stream(**kwargs) as events:
                reply = await events.get_final_message()
        else:
            reply = await client.messages.create(**kwargs)
        messages.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in reply.content],
            }
        )
        use = next(b for b in reply.content if b.type == "tool_use")
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": output(step)}
                ],
            }
        )
    upstream.script([{"kind": "ok", "content": "Fixed."}])
    return await client.messages.create(
        model="m", max_tokens=400, messages=messages, tools=[SHELL_MESSAGES]
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_messages_tool_session_outgrowing_the_window_finishes(
    start_app: AppStarter, local_upstream: LocalUpstream, stream: bool
) -> None:
    """Twenty tool rounds with thinking through a 6k window: every tool_use keeps its
    tool_result, every thinking block its signature (the fake refuses otherwise), and the
    session ends with the model's answer."""
    gw = await start_app(config(local_upstream))
    local_upstream.configure({"context_limit": WINDOW})
    final = await messages_session(gw, local_upstream, 20, stream)
    assert final.content[0].text == "Fixed."
    sent = sizes(local_upstream, "/v1/messages")
    assert len(sent) >= 21 and max(sent) <= WINDOW


async def test_messages_errors_headers_and_count_tokens(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(config(local_upstream))
    client = gw.anthropic()
    history = [
        {"role": "user", "content": "question " + "word " * 1500},
        {"role": "assistant", "content": "answer " + "word " * 1500},
        {"role": "user", "content": "and now?"},
    ]
    local_upstream.script([{"kind": "context_limit", "limit": 2000}])
    raw = await client.messages.with_raw_response.create(
        model="m",
        max_tokens=300,
        messages=history,
        extra_headers={"anthropic-beta": "context-management-2025-06-27"},
    )
    assert (await raw.parse()).content[0].text == "fake answer"
    assert raw.headers["request-id"] == "req_fake"  # relayed from the upstream
    sent = [r for r in local_upstream.requests() if r["path"] == "/v1/messages"][-1]
    headers = {k.lower(): v for k, v in sent["headers"]}
    assert headers["anthropic-beta"] == "context-management-2025-06-27"
    assert headers["anthropic-version"] == raw.http_request.headers["anthropic-version"]
    local_upstream.script([{"kind": "stream_error_event"}])
    async with client.messages.stream(model="m", max_tokens=300, messages=history) as events:
        assert (await events.get_final_message()).content[0].text == "fake answer"
    counted = await client.messages.count_tokens(model="m", messages=history)
    assert counted.input_tokens < prompt_tokens({"messages": history}, 4.0)  # after compaction
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(model="no-such-model", max_tokens=10, messages=history[-1:])
    assert missing.value.body["type"] == "error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model="m", max_tokens=10, messages="not a list")  # type: ignore[arg-type]
    assert bad.value.body["error"]["type"] == "invalid_request_error"


async def test_messages_expansion_is_answered_by_the_gateway(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(config(local_upstream))
    client = gw.anthropic()
    messages = masked_messages()
    for stream in (False, True):
        local_upstream.script([{"kind": "expand"}, {"kind": "ok", "content": "Read it: done."}])
        kwargs = {"model": "m", "max_tokens": 300, "messages": messages, "tools": [SHELL_MESSAGES]}
        if stream:
            async with client.messages.stream(**kwargs) as events:
                final = await events.get_final_message()
        else:
            final = await client.messages.create(**kwargs)
        assert [b.type for b in final.content] == ["text"] and final.content[
            0
        ].text == "Read it: done."
        second = [r for r in local_upstream.requests() if r["path"] == "/v1/messages"][-1]["json"]
        last = second["messages"][-1]["content"]
        assert any(
            b.get("type") == "tool_result" and "module_" in str(b.get("content")) for b in last
        )


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_internal_rounds_of_a_whole_answer_add_their_usage_and_pass_on_a_refusal(
    api: str, start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Not streamed: the answer after an internal round reports the tokens of both rounds, and
    an internal round the upstream refuses reaches the client as that refusal."""
    gw = await start_app(config(local_upstream))
    if api == "responses":
        client: Any = gw.openai().responses
        kwargs: dict[str, Any] = {"model": "m", "input": masked_items(), "store": False}
        kwargs["tools"] = [SHELL_RESPONSES]
    else:
        client = gw.anthropic().messages
        kwargs = {"model": "m", "max_tokens": 300, "messages": masked_messages()}
        kwargs["tools"] = [SHELL_MESSAGES]
    local_upstream.script(
        [
            {"kind": "expand", "prompt_tokens": 1000, "completion_tokens": 20},
            {"kind": "ok", "content": "done", "prompt_tokens": 3000, "completion_tokens": 5},
        ]
    )
    raw = await client.with_raw_response.create(**kwargs)
    answer = raw.parse()
    if api == "messages":
        answer = await answer
    assert raw.headers["x-compactgate-internal-rounds"] == "1"
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (4000, 25)
    if api == "responses":
        assert answer.usage.total_tokens == 4025
    refusal = {"error": {"type": "invalid_request_error", "message": "no more today"}}
    local_upstream.script([{"kind": "expand"}, {"kind": "error", "status": 400, "body": refusal}])
    bad = openai.BadRequestError if api == "responses" else anthropic.BadRequestError
    with pytest.raises(bad) as refused:
        await client.create(**kwargs)
    assert refused.value.response.json() == refusal


# -- the stand-in's rules (what makes the sessions above able to fail) ---------------------------


def test_the_fake_refuses_what_openai_refuses() -> None:
    body = responses_body(
        {}, {"kind": "tool_calls", "reasoning": True, "tool_calls": [{"name": "a"}]}, 5
    )
    reasoning, call = body["output"]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "x"}
    assert responses_problem({"input": [reasoning, call, output]}) is None
    assert "without its required 'reasoning'" in responses_problem({"input": [call, output]})
    assert "No tool call found" in responses_problem({"input": [output]})
    changed = {**reasoning, "encrypted_content": reasoning["encrypted_content"] + "x"}
    assert "could not be verified" in responses_problem({"input": [changed, call, output]})


def test_the_fake_refuses_what_anthropic_refuses() -> None:
    body = messages_body(
        {}, {"kind": "tool_calls", "reasoning": True, "tool_calls": [{"name": "a"}]}, 5
    )
    use = body["content"][-1]
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "x"}],
    }
    turns = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": body["content"]},
        result,
    ]
    assert messages_problem({"messages": turns}) is None
    assert "without `tool_result`" in messages_problem(
        {"messages": [*turns[:2], {"role": "user", "content": "?"}]}
    )
    assert "unexpected `tool_use_id`" in messages_problem({"messages": [turns[0], result]})
    thinking = {**body["content"][0], "thinking": "edited"}
    edited = [turns[0], {"role": "assistant", "content": [thinking, use]}, result]
    assert "Invalid `signature`" in messages_problem({"messages": edited})
    marked = [
        {"type": "text", "text": str(n), "cache_control": {"type": "ephemeral"}} for n in range(5)
    ]
    assert "maximum of 4" in messages_problem({"messages": [{"role": "user", "content": marked}]})


# -- context_management -------------------------------------------------------------------------


def managed_history() -> list[Any]:
    """Four tool rounds, each with a (fake-issued) thinking block and a ~700-token result."""
    messages: list[Any] = [{"role": "user", "content": "Go."}]
    for step in range(4):
        body = messages_body(
            {}, {"kind": "tool_calls", "reasoning": True, "tool_calls": [{"name": "shell"}]}, 5
        )
        use = body["content"][-1]
        messages.append({"role": "assistant", "content": body["content"]})
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": output(step)}
        messages.append({"role": "user", "content": [result]})
    return messages


@pytest.mark.parametrize("mode", ["native", "strip", "emulate"])
async def test_context_management_is_forwarded_stripped_or_emulated(
    start_app: AppStarter, local_upstream: LocalUpstream, mode: str
) -> None:
    settings = config(local_upstream)
    settings["models"][0].update(context_window=100_000, context_management=mode)
    gw = await start_app(settings)
    edits = [
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 1000},
            "keep": {"type": "tool_uses", "value": 1},
        },
    ]
    response = await gw.http.post(
        f"{gw.url}/v1/messages",
        json={
            "model": "m",
            "max_tokens": 100,
            "messages": managed_history(),
            "context_management": {"edits": edits},
        },
        headers={"anthropic-beta": "context-management-2025-06-27"},
    )
    assert response.status_code == 200, response.text
    sent = local_upstream.requests()[-1]["json"]
    if mode == "native":
        assert sent["context_management"] == {"edits": edits}
        assert "context_management" not in response.json()
        return
    assert "context_management" not in sent
    results = [
        b["content"]
        for m in sent["messages"]
        if m["role"] == "user"
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    thinking = [
        b
        for m in sent["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b.get("type") == "thinking"
    ]
    if mode == "strip":
        assert len(thinking) == 4 and all("module_" in r for r in results)
        assert "context_management" not in response.json()
        return
    last_turn = [m for m in sent["messages"] if m["role"] == "assistant"][-1]
    assert len(thinking) == 1 and thinking[0] in last_turn["content"]  # the latest turn's kept
    assert [("module_" in r) for r in results] == [False, False, False, True]
    applied = {e["type"]: e for e in response.json()["context_management"]["applied_edits"]}
    assert applied["clear_tool_uses_20250919"]["cleared_tool_uses"] == 3
    assert applied["clear_tool_uses_20250919"]["cleared_input_tokens"] > 1500
    assert applied["clear_thinking_20251015"]["cleared_thinking_turns"] == 3
    bad = await gw.http.post(
        f"{gw.url}/v1/messages",
        json={
            "model": "m",
            "max_tokens": 10,
            "messages": managed_history(),
            "context_management": {"edits": "all"},
        },
    )
    assert bad.status_code == 400 and bad.json()["type"] == "error"


async def test_emulated_context_management_is_reported_in_a_stream(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Streamed, the edits the gateway applied come in the message_delta event, where the
    anthropic SDK reads them; every other event is relayed as it came."""
    settings = config(local_upstream)
    settings["models"][0].update(context_window=100_000, context_management="emulate")
    gw = await start_app(settings)
    client = gw.anthropic()
    edits = [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]
    async with client.beta.messages.stream(
        model="m",
        max_tokens=100,
        messages=managed_history(),
        context_management={"edits": edits},  # type: ignore[typeddict-item]
        betas=["context-management-2025-06-27"],
    ) as stream:
        deltas = [e async for e in stream if e.type == "message_delta"]
        final = await stream.get_final_message()
    assert final.content  # the answer itself came through
    [delta] = deltas
    assert delta.context_management is not None
    [applied] = delta.context_management.applied_edits
    assert applied.type == "clear_thinking_20251015"
    assert applied.cleared_thinking_turns == 3  # type: ignore[union-attr]
    assert "context_management" not in local_upstream.requests()[-1]["json"]
