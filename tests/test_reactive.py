"""The reactive path (design D6): the upstream says "context length exceeded" after all.

The gateway is configured with a window far LARGER than the fake upstream's real limit, so the
proactive check never fires and every overflow reaches the upstream. For every provider style
the fake can speak, the client (the official openai client) must still get an ordinary
completion: the gateway recognises the error, learns the real window, compacts the client's
ORIGINAL request again and retries, streaming too. What the upstream received tells whether the
retry was right: smaller, system prompt and latest user message intact, tool calls paired.

In process (tests/in_process.py): every decision here is made before a byte reaches the client
(the error, or a stream's first events, are read whole), so nothing needs a socket or a clock;
each test has an app of its own, so what one learnt never leaks into the next.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import openai
import pytest

from gateway.devtools.echo_upstream import estimate_prompt_tokens
from tests.fake_upstream import STYLES, render_context_error
from tests.in_process import AppGateway, AppStarter, LocalUpstream

CONFIGURED_WINDOW = 64_000  # what the operator (wrongly) configured
LIMIT = 2_000  # the fake upstream's real limit, in its own tokens (chars of JSON / 4)
SYSTEM = "You are a careful coding agent. Answer briefly. Never invent file contents."
LATEST = "Now summarise what you found in all the files, in three bullet points."
# Styles whose error body states the limit, so the gateway can learn the real window.
STATES_LIMIT = tuple(s for s in STYLES if s != "bedrock")


def conversation(turns: int = 14, size: int = 900) -> list[dict[str, Any]]:
    """System prompt, `turns` agent Turns (user, tool call, tool result, answer), latest user."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        call_id = f"call_{turn:03d}"
        body = "\n".join(
            f"line {i}: value_{turn}_{i} = compute({i}, {turn})" for i in range(size // 36)
        )
        messages += [
            {
                "role": "user",
                "content": f"Turn {turn}: read file_{turn}.py and tell me what it does.",
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"path": f"file_{turn}.py"}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": body},
            {"role": "assistant", "content": f"file_{turn}.py computes values for turn {turn}."},
        ]
    messages.append({"role": "user", "content": LATEST})
    return messages


def fake_tokens(messages: list[dict[str, Any]]) -> int:
    """The fake upstream's own count of these messages (chars of their JSON / 4)."""
    return estimate_prompt_tokens({"messages": messages})


MESSAGES = conversation()
assert fake_tokens(MESSAGES) > 2 * LIMIT, "the conversation must overflow the fake's limit"


# -- a gateway of the test's own: one model, `m`, on the local upstream -------------------------


async def start(
    start_app: AppStarter, upstream: LocalUpstream, **model: Any
) -> tuple[AppGateway, openai.AsyncOpenAI]:
    """An app whose model `m` is configured with a window far above the upstream's real limit,
    and the official SDK on it."""
    entry = {
        "name": "m",
        "upstream": {"base_url": upstream.base_url},
        "tokenizer": "chars:4",
        "context_window": CONFIGURED_WINDOW,
        **model,
    }
    gw = await start_app(
        {
            "server": {"stream_usage": "passthrough"},
            "models": [entry],
            "policies": {"strict": {"recovery_mode": "error"}},
        }
    )
    return gw, gw.openai()


async def plan_window(gw: AppGateway) -> int | None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = await gw.http.post(f"{gw.base_url}/compactgate/plan", json=body)
    assert response.status_code == 200, response.text
    return response.json()["context_window"]


# -- checks on what the upstream received --------------------------------------------------------


def assert_valid_retry(first: dict[str, Any], retry: dict[str, Any]) -> None:
    """The retried request is smaller and keeps what must never be dropped (design D1)."""
    sent = retry["messages"]
    assert estimate_prompt_tokens(retry) < estimate_prompt_tokens(first)
    assert estimate_prompt_tokens(retry) <= LIMIT  # what the fake accepted
    assert sent[0] == {"role": "system", "content": SYSTEM}
    assert sent[-1] == {"role": "user", "content": LATEST}
    assert_tool_pairs(sent)
    # Compacted from the client's original request, never from the first attempt's body.
    assert first["messages"] == MESSAGES
    original = [json.dumps(m, sort_keys=True) for m in MESSAGES]
    positions = [
        original.index(json.dumps(m, sort_keys=True))
        for m in sent
        if json.dumps(m, sort_keys=True) in original
    ]
    assert positions == sorted(positions), "message order changed"


def assert_tool_pairs(messages: list[dict[str, Any]]) -> None:
    """Every tool call is answered by its result right after it, and no result is orphaned."""
    open_calls: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, (
                f"orphaned tool result {message['tool_call_id']}"
            )
            open_calls.discard(message["tool_call_id"])
            continue
        assert not open_calls, f"tool calls without results: {open_calls}"
        for call in message.get("tool_calls") or []:
            open_calls.add(call["id"])
    assert not open_calls


def chat_bodies(upstream: LocalUpstream) -> list[dict[str, Any]]:
    return [r["json"] for r in upstream.chat_requests()]


# -- every provider style ----------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
async def test_non_streaming_context_error_is_recovered(
    style: str, start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw, client = await start(start_app, local_upstream)
    local_upstream.configure({"context_limit": LIMIT, "style": style})
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=50
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == f"echo: {LATEST}"
    retries = int(raw.headers["x-compactgate-retries"])
    assert 1 <= retries <= 2  # max_retries
    bodies = chat_bodies(local_upstream)
    assert len(bodies) == retries + 1
    assert_valid_retry(bodies[0], bodies[-1])
    assert int(raw.headers["x-compactgate-tokens-after"]) < int(
        raw.headers["x-compactgate-tokens-before"]
    )
    assert raw.headers["x-compactgate-steps"] != "none"
    if style in STATES_LIMIT:
        assert await plan_window(gw) == LIMIT
    else:  # Bedrock states no number: the refused request (with its reserved output) bounds
        # the window from above, lowering it without going under the upstream's real limit.
        assert LIMIT < (await plan_window(gw) or 0) < CONFIGURED_WINDOW


@pytest.mark.parametrize("style", STYLES)
async def test_streaming_context_error_is_recovered(
    style: str, start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw, client = await start(start_app, local_upstream)
    local_upstream.configure({"context_limit": LIMIT, "style": style})
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES, max_tokens=50, stream=True
    ) as response:
        assert response.http_response.status_code == 200
        retries = int(response.headers["x-compactgate-retries"])
        chunks = [chunk async for chunk in await response.parse()]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"echo: {LATEST}"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert 1 <= retries <= 2
    bodies = chat_bodies(local_upstream)
    assert len(bodies) == retries + 1
    assert all(b["stream"] is True for b in bodies)
    assert_valid_retry(bodies[0], bodies[-1])
    if style in STATES_LIMIT:
        assert await plan_window(gw) == LIMIT


# -- what is learned, and what is never learned ---------------------------------------------------


async def test_learned_window_is_used_and_never_raised_by_a_later_error(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw, client = await start(start_app, local_upstream)
    local_upstream.configure({"context_limit": LIMIT, "style": "openai"})
    first = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert first.headers["x-compactgate-retries"] == "1"
    assert await plan_window(gw) == LIMIT

    # The next request is compacted proactively against the learned window: no error, no retry.
    local_upstream.reset()
    local_upstream.configure({"context_limit": LIMIT, "style": "openai"})
    second = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert second.headers["x-compactgate-retries"] == "0"
    assert second.headers["x-compactgate-steps"] != "none"
    assert len(local_upstream.chat_requests()) == 1

    # An error that states a LARGER window does not raise what was learned.
    local_upstream.reset()
    status, headers, raw = render_context_error("openai", LIMIT * 4, LIMIT * 5)
    local_upstream.script(
        [{"kind": "error", "status": status, "headers": headers, "body": json.loads(raw)}]
    )
    third = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert third.headers["x-compactgate-retries"] == "1"
    assert third.parse().choices[0].message.content
    assert await plan_window(gw) == LIMIT


# -- when nothing can fit -------------------------------------------------------------------------


def oversized_latest() -> list[dict[str, Any]]:
    """The latest user message alone is over the limit: dropping history cannot help."""
    huge = "Please review this log line by line.\n" + "\n".join(
        f"2026-11-21T10:00:{i % 60:02d} worker-{i} processed batch {i} in {i % 97} ms"
        for i in range(700)
    )
    return [*conversation(turns=2), {"role": "user", "content": huge}]


async def test_nothing_fits_with_recovery_error_is_one_clear_400(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw, client = await start(start_app, local_upstream, policy="strict")
    messages = oversized_latest()
    assert fake_tokens(messages[-1:]) > LIMIT
    local_upstream.configure({"context_limit": LIMIT, "style": "openai"})
    response = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "m", "messages": messages, "max_tokens": 50},
    )
    assert response.status_code == 400
    assert response.headers["x-compactgate-retries"] == "1"
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "latest user message" in error["message"]
    # The first attempt went upstream (the gateway could not know); nothing after it.
    assert len(local_upstream.chat_requests()) == 1
    with pytest.raises(openai.BadRequestError) as info:
        local_upstream.reset()
        local_upstream.configure({"context_limit": LIMIT, "style": "openai"})
        await client.chat.completions.create(model="m", messages=messages, max_tokens=50)
    assert info.value.code == "context_length_exceeded"


async def test_nothing_fits_with_default_truncate_still_answers(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    _, client = await start(start_app, local_upstream)
    messages = oversized_latest()
    local_upstream.configure({"context_limit": LIMIT, "style": "openai"})
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=messages, max_tokens=50
    )
    assert raw.parse().choices[0].message.content
    assert int(raw.headers["x-compactgate-retries"]) >= 1
    last = chat_bodies(local_upstream)[-1]
    sent = last["messages"]
    assert sent[0] == {"role": "system", "content": SYSTEM}
    assert sent[-1]["role"] == "user" and "characters cut by compactgate" in sent[-1]["content"]
    assert estimate_prompt_tokens(last) <= LIMIT


# -- bounded: never loops -------------------------------------------------------------------------


async def test_retries_are_bounded_by_max_retries(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    one_retry, _ = await start(start_app, local_upstream, max_retries=1)
    lenient, _ = await start(start_app, local_upstream)
    # An upstream that keeps saying "too long" whatever it gets (it states no numbers).
    status, headers, raw = render_context_error("bedrock", 0, 0)
    error = {"kind": "error", "status": status, "headers": headers, "body": json.loads(raw)}
    local_upstream.script([error] * 6)
    started = time.monotonic()
    response = await one_retry.http.post(
        f"{one_retry.base_url}/chat/completions",
        json={"model": "m", "messages": MESSAGES, "max_tokens": 50},
    )
    assert time.monotonic() - started < 10
    assert response.status_code == 400  # the upstream's own error, relayed once retries ran out
    assert response.json() == json.loads(raw)
    assert response.headers["x-compactgate-retries"] == "1"
    assert len(local_upstream.chat_requests()) == 2

    local_upstream.reset()
    local_upstream.script([error] * 6)
    response = await lenient.http.post(
        f"{lenient.base_url}/chat/completions",
        json={"model": "m", "messages": MESSAGES, "max_tokens": 50, "stream": True},
    )
    assert response.status_code == 400
    assert response.headers["x-compactgate-retries"] == "2"  # the default max_retries
    assert len(local_upstream.chat_requests()) == 3


# -- streaming quirks ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["stream_error_event", "empty_200"])
async def test_streaming_quirks_are_recovered(
    kind: str, start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """200 then an error event before any content; llama-cpp-python's empty 200 stream."""
    _, client = await start(start_app, local_upstream)
    local_upstream.script([{"kind": kind}])
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES, max_tokens=50, stream=True
    ) as response:
        retries = response.headers["x-compactgate-retries"]
        chunks = [chunk async for chunk in await response.parse()]
    assert retries == "1"
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == f"echo: {LATEST}"
    )
    bodies = chat_bodies(local_upstream)
    assert len(bodies) == 2
    assert_tool_pairs(bodies[1]["messages"])
    assert estimate_prompt_tokens(bodies[1]) < estimate_prompt_tokens(bodies[0])
    assert bodies[1]["messages"][-1] == {"role": "user", "content": LATEST}


async def test_an_empty_stream_after_the_last_retry_is_a_502_not_a_silent_200(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    _, client = await start(start_app, local_upstream)
    local_upstream.script([{"kind": "empty_200"}] * 5)
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=50, stream=True
        )
    assert info.value.status_code == 502
    assert info.value.code == "bad_gateway"
    assert len(local_upstream.chat_requests()) == 3  # the first attempt and max_retries (2)


async def test_finish_reason_length_is_not_a_context_error(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """The prompt fit but the answer did not (llama.cpp's answer): relay it, never retry."""
    gw, client = await start(start_app, local_upstream)
    local_upstream.script(
        [{"kind": "ok", "content": "truncated ans", "finish_reason": "length"}] * 2
    )
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=3
    )
    assert raw.parse().choices[0].finish_reason == "length"
    assert raw.headers["x-compactgate-retries"] == "0"
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES, max_tokens=3, stream=True
    ) as response:
        assert response.headers["x-compactgate-retries"] == "0"
        chunks = [chunk async for chunk in await response.parse()]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len(local_upstream.chat_requests()) == 2
    assert await plan_window(gw) == CONFIGURED_WINDOW


# -- the retry's window, in-process -----------------------------------------------------------


@pytest.mark.parametrize(
    ("signature", "limit", "requested", "max_tokens"),
    [
        ("openai", LIMIT, fake_tokens(MESSAGES), None),  # both numbers stated
        ("openai", LIMIT, fake_tokens(MESSAGES), 50),  # an explicit output reserve
        ("gemini", LIMIT, None, None),  # only the limit
        ("bedrock", None, None, None),  # no numbers at all
    ],
)
async def test_the_retry_targets_the_real_limit_not_a_share_of_the_configured_window(
    signature: str, limit: int | None, requested: int | None, max_tokens: int | None
) -> None:
    """Regression: the retry window was floored at the first attempt's output reserve, 20 % of
    the configured 64,000 tokens, so the "tighter" window was 12,836 and nothing was cut."""
    from gateway.config import parse_config
    from gateway.devtools.parts import parts
    from gateway.expansion import Expansion
    from gateway.path.accounting import Accounting
    from gateway.path.forward import Call, Forwarder
    from gateway.path.outcome import Overflow
    from gateway.wire import CHAT, parse_chat_request
    from gateway.wire.context_errors import ContextError

    upstream = {"base_url": "http://127.0.0.1:9/v1"}
    config = parse_config(
        {
            "models": [
                {
                    "name": "m",
                    "upstream": upstream,
                    "tokenizer": "chars:4",
                    "context_window": CONFIGURED_WINDOW,
                }
            ]
        }
    )
    gw = parts(config)
    route = gw.route("m")
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    request = parse_chat_request(json.dumps(body).encode(), 10_000)
    first = await gw.engine.prepare(request, route, "t", window=gw.effective_window(route))
    assert first.tokens_after == first.tokens_before  # the configured window let it through
    error = ContextError(signature, limit, requested)
    gw.windows.learn(route, error.limit, error.signature)
    expansion = Expansion(gw.tool_outputs, gw.upstream, gw.metrics)
    forwarder = Forwarder(gw.sender, gw.engine, expansion, gw.tool_outputs, gw.windows, gw.metrics)
    books = Accounting(gw.metrics, gw.events, gw.costs, gw.calibration, "chat", True)
    call = Call(CHAT, request, route, "t", [], books)
    retry = await forwarder.recompact(call, first, Overflow(error), error)
    assert retry.budget is not None
    assert retry.budget.context_window <= (limit or CONFIGURED_WINDOW)
    if limit is not None:  # one retry is enough when the limit is stated
        assert fake_tokens(retry.messages) <= LIMIT
    else:  # no numbers: the messages' budget is 60 % of what was sent
        sent_messages = first.tokens_after - first.tokens_by_region["tools"]
        assert retry.budget.limit <= 0.6 * sent_messages
        assert retry.tokens_after < 0.7 * first.tokens_after
    assert retry.messages[0] == {"role": "system", "content": SYSTEM}
    assert retry.messages[-1] == {"role": "user", "content": LATEST}
    assert_tool_pairs(retry.messages)


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_the_last_context_error_quotes_the_real_window_and_request(
    start_app: AppStarter, local_upstream: LocalUpstream, api: str
) -> None:
    """Regression: after the upstream's context errors the gateway's final 400 named the
    window of its last retry ("the 7-token context window"), a window scaled down into the
    gateway's units, not the model's. The upstream here counts twice what the gateway does
    and allows 60 tokens: the retry compacts against about 30, and nothing fits either."""
    config = {
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": local_upstream.base_url},
                "tokenizer": "chars:4",
                "context_window": CONFIGURED_WINDOW,
                "policy": "strict",
            }
        ],
        "policies": {"strict": {"recovery_mode": "error"}},
    }
    gw = await start_app(config)
    local_upstream.configure({"context_limit": 60, "style": "openai", "usage_tokenizer": "chars:2"})
    latest = "Please explain the whole design once more, slowly. " * 6
    path, body = {
        "chat": (
            "/v1/chat/completions",
            {"max_tokens": 10, "messages": [{"role": "user", "content": latest}]},
        ),
        "responses": ("/v1/responses", {"max_output_tokens": 10, "input": latest}),
        "messages": (
            "/v1/messages",
            {"max_tokens": 10, "messages": [{"role": "user", "content": latest}]},
        ),
    }[api]
    response = await gw.http.post(path, json={"model": "m", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if api == "responses":  # the fake's Responses error states no figures, as OpenAI's may not
        assert "without saying its window" in error["message"], error
        assert re.search(r"about \d+ tokens by the gateway's count", error["message"]), error
    else:
        assert "window is 60 tokens" in error["message"], error
        assert re.search(r"it counted \d+ tokens in this request", error["message"]), error
    assert not re.search(r"\d+-token context window", error["message"]), error
    assert len(local_upstream.requests()) == 1  # refused once; the retry could not be sent
