"""The reactive path (design D6): the upstream says "context length exceeded" after all.

The gateway is configured with a window far LARGER than the fake upstream's real limit, so the
proactive check never fires and every overflow reaches the upstream. For every provider style
the fake can speak, the client (the official openai client) must still get an ordinary
completion: the gateway recognises the error, learns the real window, compacts the client's
ORIGINAL request again and retries, streaming too. What the upstream received tells whether the
retry was right: smaller, system prompt and latest user message intact, tool calls paired.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.devtools.echo_upstream import estimate_prompt_tokens
from tests.conftest import GatewayProcess
from tests.fake_upstream import STYLES, FakeUpstream, render_context_error
from tests.gateway_process import gateway_process
from tests.in_process import AppStarter, LocalUpstream

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


# -- one gateway for the module: a model per style and mode (learned windows are per model) -----


def model_names() -> list[str]:
    return [f"{style}-{mode}" for style in STYLES for mode in ("plain", "stream")]


def gateway_config(fake: FakeUpstream) -> dict[str, Any]:
    def model(name: str, **extra: Any) -> dict[str, Any]:
        return {
            "name": name,
            "upstream": {"base_url": fake.base_url},
            "tokenizer": "chars:4",
            "context_window": CONFIGURED_WINDOW,
            **extra,
        }

    models = [model(name) for name in model_names()]
    models += [
        model("strict", policy="strict"),
        model("lenient"),
        model("one-retry", max_retries=1),
        model("quirks"),
        model("length"),
        model("again"),
    ]
    return {
        "server": {"stream_usage": "passthrough"},
        "models": models,
        "policies": {"strict": {"recovery_mode": "error"}},
    }


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    config = gateway_config(fake_upstream_server)
    with gateway_process(config, tmp_path_factory.mktemp("reactive")) as gateway:
        yield gateway


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=gateway.base_url, api_key="sk-client", max_retries=0, timeout=60
    ) as c:
        yield c


def plan_window(gateway: GatewayProcess, model: str) -> int | None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{gateway.base_url}/compactgate/plan", json=body, timeout=20)
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


def chat_bodies(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [r["json"] for r in fake.chat_requests()]


# -- every provider style ----------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
def test_non_streaming_context_error_is_recovered(
    style: str, gateway: GatewayProcess, client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.configure({"context_limit": LIMIT, "style": style})
    model = f"{style}-plain"
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=50
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == f"echo: {LATEST}"
    retries = int(raw.headers["x-compactgate-retries"])
    assert 1 <= retries <= 2  # max_retries
    bodies = chat_bodies(fake_upstream)
    assert len(bodies) == retries + 1
    assert_valid_retry(bodies[0], bodies[-1])
    assert int(raw.headers["x-compactgate-tokens-after"]) < int(
        raw.headers["x-compactgate-tokens-before"]
    )
    assert raw.headers["x-compactgate-steps"] != "none"
    if style in STATES_LIMIT:
        assert plan_window(gateway, model) == LIMIT
    else:  # Bedrock states no number: the refused request (with its reserved output) bounds
        # the window from above, lowering it without going under the upstream's real limit.
        assert LIMIT < plan_window(gateway, model) < CONFIGURED_WINDOW


@pytest.mark.parametrize("style", STYLES)
def test_streaming_context_error_is_recovered(
    style: str, gateway: GatewayProcess, client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.configure({"context_limit": LIMIT, "style": style})
    model = f"{style}-stream"
    with client.chat.completions.with_streaming_response.create(
        model=model, messages=MESSAGES, max_tokens=50, stream=True
    ) as response:
        assert response.http_response.status_code == 200
        retries = int(response.headers["x-compactgate-retries"])
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"echo: {LATEST}"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert 1 <= retries <= 2
    bodies = chat_bodies(fake_upstream)
    assert len(bodies) == retries + 1
    assert all(b["stream"] is True for b in bodies)
    assert_valid_retry(bodies[0], bodies[-1])
    if style in STATES_LIMIT:
        assert plan_window(gateway, model) == LIMIT


# -- what is learned, and what is never learned ---------------------------------------------------


def test_learned_window_is_used_and_never_raised_by_a_later_error(
    gateway: GatewayProcess, client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.configure({"context_limit": LIMIT, "style": "openai"})
    first = client.chat.completions.with_raw_response.create(model="again", messages=MESSAGES)
    assert first.headers["x-compactgate-retries"] == "1"
    assert plan_window(gateway, "again") == LIMIT

    # The next request is compacted proactively against the learned window: no error, no retry.
    fake_upstream.reset()
    fake_upstream.configure({"context_limit": LIMIT, "style": "openai"})
    second = client.chat.completions.with_raw_response.create(model="again", messages=MESSAGES)
    assert second.headers["x-compactgate-retries"] == "0"
    assert second.headers["x-compactgate-steps"] != "none"
    assert len(fake_upstream.chat_requests()) == 1

    # An error that states a LARGER window does not raise what was learned.
    fake_upstream.reset()
    status, headers, raw = render_context_error("openai", LIMIT * 4, LIMIT * 5)
    fake_upstream.script(
        [{"kind": "error", "status": status, "headers": headers, "body": json.loads(raw)}]
    )
    third = client.chat.completions.with_raw_response.create(model="again", messages=MESSAGES)
    assert third.headers["x-compactgate-retries"] == "1"
    assert third.parse().choices[0].message.content
    assert plan_window(gateway, "again") == LIMIT


# -- when nothing can fit -------------------------------------------------------------------------


def oversized_latest() -> list[dict[str, Any]]:
    """The latest user message alone is over the limit: dropping history cannot help."""
    huge = "Please review this log line by line.\n" + "\n".join(
        f"2026-11-21T10:00:{i % 60:02d} worker-{i} processed batch {i} in {i % 97} ms"
        for i in range(700)
    )
    return [*conversation(turns=2), {"role": "user", "content": huge}]


def test_nothing_fits_with_recovery_error_is_one_clear_400(
    gateway: GatewayProcess, client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    messages = oversized_latest()
    assert fake_tokens(messages[-1:]) > LIMIT
    fake_upstream.configure({"context_limit": LIMIT, "style": "openai"})
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "strict", "messages": messages, "max_tokens": 50},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.headers["x-compactgate-retries"] == "1"
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "latest user message" in error["message"]
    # The first attempt went upstream (the gateway could not know); nothing after it.
    assert len(fake_upstream.chat_requests()) == 1
    with pytest.raises(openai.BadRequestError) as info:
        fake_upstream.reset()
        fake_upstream.configure({"context_limit": LIMIT, "style": "openai"})
        client.chat.completions.create(model="strict", messages=messages, max_tokens=50)
    assert info.value.code == "context_length_exceeded"


def test_nothing_fits_with_default_truncate_still_answers(
    gateway: GatewayProcess, client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    messages = oversized_latest()
    fake_upstream.configure({"context_limit": LIMIT, "style": "openai"})
    raw = client.chat.completions.with_raw_response.create(
        model="lenient", messages=messages, max_tokens=50
    )
    assert raw.parse().choices[0].message.content
    assert int(raw.headers["x-compactgate-retries"]) >= 1
    last = chat_bodies(fake_upstream)[-1]
    sent = last["messages"]
    assert sent[0] == {"role": "system", "content": SYSTEM}
    assert sent[-1]["role"] == "user" and "characters cut by compactgate" in sent[-1]["content"]
    assert estimate_prompt_tokens(last) <= LIMIT


# -- bounded: never loops -------------------------------------------------------------------------


def test_retries_are_bounded_by_max_retries(
    gateway: GatewayProcess, client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    # An upstream that keeps saying "too long" whatever it gets (it states no numbers).
    status, headers, raw = render_context_error("bedrock", 0, 0)
    error = {"kind": "error", "status": status, "headers": headers, "body": json.loads(raw)}
    fake_upstream.script([error] * 6)
    started = time.monotonic()
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "one-retry", "messages": MESSAGES, "max_tokens": 50},
        timeout=30,
    )
    assert time.monotonic() - started < 10
    assert response.status_code == 400  # the upstream's own error, relayed once retries ran out
    assert response.json() == json.loads(raw)
    assert response.headers["x-compactgate-retries"] == "1"
    assert len(fake_upstream.chat_requests()) == 2

    fake_upstream.reset()
    fake_upstream.script([error] * 6)
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "lenient", "messages": MESSAGES, "max_tokens": 50, "stream": True},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.headers["x-compactgate-retries"] == "2"  # the default max_retries
    assert len(fake_upstream.chat_requests()) == 3


# -- streaming quirks ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["stream_error_event", "empty_200"])
def test_streaming_quirks_are_recovered(
    kind: str, client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    """200 then an error event before any content; llama-cpp-python's empty 200 stream."""
    fake_upstream.script([{"kind": kind}])
    with client.chat.completions.with_streaming_response.create(
        model="quirks", messages=MESSAGES, max_tokens=50, stream=True
    ) as response:
        retries = response.headers["x-compactgate-retries"]
        chunks = list(response.parse())
    assert retries == "1"
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == f"echo: {LATEST}"
    )
    bodies = chat_bodies(fake_upstream)
    assert len(bodies) == 2
    assert_tool_pairs(bodies[1]["messages"])
    assert estimate_prompt_tokens(bodies[1]) < estimate_prompt_tokens(bodies[0])
    assert bodies[1]["messages"][-1] == {"role": "user", "content": LATEST}


def test_an_empty_stream_after_the_last_retry_is_a_502_not_a_silent_200(
    client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script([{"kind": "empty_200"}] * 5)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model="quirks", messages=MESSAGES, max_tokens=50, stream=True
        )
    assert info.value.status_code == 502
    assert info.value.code == "bad_gateway"
    assert len(fake_upstream.chat_requests()) == 3  # the first attempt and max_retries (2)


def test_finish_reason_length_is_not_a_context_error(
    gateway: GatewayProcess, client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    """The prompt fit but the answer did not (llama.cpp's answer): relay it, never retry."""
    fake_upstream.script(
        [{"kind": "ok", "content": "truncated ans", "finish_reason": "length"}] * 2
    )
    raw = client.chat.completions.with_raw_response.create(
        model="length", messages=MESSAGES, max_tokens=3
    )
    assert raw.parse().choices[0].finish_reason == "length"
    assert raw.headers["x-compactgate-retries"] == "0"
    with client.chat.completions.with_streaming_response.create(
        model="length", messages=MESSAGES, max_tokens=3, stream=True
    ) as response:
        assert response.headers["x-compactgate-retries"] == "0"
        chunks = list(response.parse())
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len(fake_upstream.chat_requests()) == 2
    assert plan_window(gateway, "length") == CONFIGURED_WINDOW


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
