"""Hostile input against a real `compactgate serve` process (design D15.3): no 5xx for any
client input on any endpoint or frame, errors in each API's own shape, nothing unparseable or
half-parsed upstream, and the process keeps serving.

The generated part is the in-process suite's (tests/test_fuzz_in_process.py: bodies from every
wire API's schema, broken structurally and at the byte level, frames on the Responses
WebSocket), with fewer examples, here through real sockets, uvicorn's parser and the fake
upstream process; every answer is judged by tests/fuzz_oracle.py. A table adds the cases too big
to generate (10,000 levels of nesting and a million, 10,000 messages, a 30 MB message). Bounded:
the whole module runs in well under a minute and a half on a quiet machine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.summaries.transcript import SYSTEM_PROMPT
from tests.asgi_socket import FINALS
from tests.conftest import GatewayProcess
from tests.fake_upstream import FakeUpstream
from tests.fuzz_oracle import MARK, PATHS, answer_problems, socket_problems, upstream_problems
from tests.fuzz_strategies import (
    FUZZ,
    MODELS,
    call_ids,
    chat_bodies,
    compact_bodies,
    count_tokens_bodies,
    encode,
    fuzz_config,
    json_values,
    mangled,
    messages_bodies,
    mutated,
    responses_bodies,
    socket_frames,
    texts,
)
from tests.gateway_process import gateway_process

MAX_BODY = 40 * 1024 * 1024
FUZZ_E2E = settings(FUZZ, max_examples=max(10, FUZZ.max_examples // 3))
EXAMPLES = itertools.count()
SCHEMAS: dict[str, Any] = {
    "chat": chat_bodies(),
    "responses": responses_bodies(),
    "messages": messages_bodies(),
    "count_tokens": count_tokens_bodies(),
    "compact": compact_bodies(),
}


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    base = fake_upstream_server.base_url
    config = fuzz_config(base)
    config["server"] = {"max_body_bytes": MAX_BODY, "body_read_timeout_s": 30}
    config["models"].append(
        {
            "name": "tiny-tiktoken",
            "upstream": {"base_url": base},
            "context_window": 400,
            "max_output_tokens": 64,
            "tokenizer": "tiktoken:o200k_base",
            "retry": {"max_attempts": 1},
        }
    )
    with gateway_process(config, tmp_path_factory.mktemp("fuzz")) as gw:
        yield gw


@pytest.fixture(scope="module")
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        yield client


# -- the checks ---------------------------------------------------------------------------------


def check(
    gateway: GatewayProcess,
    fake: FakeUpstream,
    http: httpx.Client,
    raw: bytes,
    api: str = "chat",
) -> httpx.Response:
    """One hostile body on `api`'s endpoint, judged by tests/fuzz_oracle.py."""
    fake.reset()
    example = str(next(EXAMPLES))
    response = http.post(
        PATHS[api],
        content=raw,
        headers={
            "content-type": "application/json",
            "authorization": "Bearer sk-fuzz",
            MARK: example,
        },
    )
    relayed = "x-compactgate-steps" in response.headers
    status, content = response.status_code, response.content
    problems = answer_problems(api, status, response.headers, content, relayed)
    assert not problems, (api, raw[:1000], problems, gateway.output()[-3000:])
    code = response.json()["error"].get("code") if status >= 400 else None
    refused = status >= 400 and not relayed and code != "context_length_exceeded"
    problems = upstream_problems(fake.requests(), example, refused)
    assert not problems, (api, raw[:1000], problems)
    assert gateway.process.popen.poll() is None, gateway.output()[-3000:]
    return response


def assert_still_serving(gateway: GatewayProcess) -> None:
    with openai.OpenAI(
        base_url=gateway.base_url, api_key="sk-after", max_retries=0, timeout=30
    ) as api:
        reply = api.chat.completions.create(
            model="big", messages=[{"role": "user", "content": "still there?"}]
        )
    assert reply.choices[0].message.content
    assert gateway.process.popen.poll() is None


# -- the fuzzers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", list(SCHEMAS))
@FUZZ_E2E
@given(data=st.data())
def test_generated_and_broken_bodies(
    gateway: GatewayProcess,
    fake_upstream: FakeUpstream,
    http: httpx.Client,
    api: str,
    data: st.DataObject,
) -> None:
    body = data.draw(st.one_of(SCHEMAS[api], mutated(SCHEMAS[api])))
    check(gateway, fake_upstream, http, encode(body), api)


@pytest.mark.parametrize("api", list(SCHEMAS))
@FUZZ_E2E
@given(data=st.data())
def test_damaged_bytes(
    gateway: GatewayProcess,
    fake_upstream: FakeUpstream,
    http: httpx.Client,
    api: str,
    data: st.DataObject,
) -> None:
    check(gateway, fake_upstream, http, data.draw(mangled(SCHEMAS[api])), api)


@FUZZ_E2E
@given(frames=socket_frames())
def test_websocket_frames(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, frames: list[Any]
) -> None:
    """Every frame asking for an answer gets one ending in a final frame, never a 5xx, and the
    socket then still answers a good request."""
    fake_upstream.reset()
    example = str(next(EXAMPLES))
    asyncio.run(_socket_session(gateway, frames, example))
    assert not upstream_problems(fake_upstream.requests(), example, refused=False)


async def _socket_session(gateway: GatewayProcess, frames: list[Any], example: str) -> None:
    url = f"ws://127.0.0.1:{gateway.port}/v1/responses"
    headers = {"authorization": "Bearer sk-fuzz", MARK: example}
    last_id = "resp_unknown"
    async with connect(url, additional_headers=headers, max_size=None) as socket:
        for frame in [*frames, {"type": "response.create", "model": "big", "input": "hi"}]:
            if isinstance(frame, bytes | str):
                await socket.send(frame)
            else:
                if frame.get("previous_response_id") == "last":
                    frame = {**frame, "previous_response_id": last_id}
                await socket.send(encode(frame).decode())
                if frame.get("type") == "response.processed":
                    continue
            answer = []
            while not answer or answer[-1].get("type") not in FINALS:
                answer.append(json.loads(await asyncio.wait_for(socket.recv(), 30)))
            assert not socket_problems(answer), (frame, answer[-3:])
            done = (
                answer[-1].get("response") if answer[-1]["type"] == "response.completed" else None
            )
            if isinstance(done, dict) and isinstance(done.get("id"), str):
                last_id = done["id"]
        assert answer[-1]["type"] == "response.completed"


def nested(depth: int, leaf: bytes = b"1") -> bytes:
    return b'{"a":' * depth + leaf + b"}" * depth


def body_with(extra: bytes) -> bytes:
    return b'{"model":"big","messages":[{"role":"user","content":"hi"}],"x":' + extra + b"}"


def many_messages(count: int, model: str, *, paired: bool = True) -> bytes:
    """A long agent conversation: Turns of question, tool call, tool result, answer. Unpaired,
    the call ids repeat and the results answer calls that were never made."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    n = 0
    while len(messages) + 4 < count:
        n += 1
        call, result = (
            (f"call_{n}", f"call_{n}") if paired else (f"call_{n % 7}", f"call_{n * 3 % 11}")
        )
        messages += [
            {"role": "user", "content": f"question {n}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": result, "content": "result " * 5},
            {"role": "assistant", "content": "ok"},
        ]
    messages += [{"role": "user", "content": "last"}] * (count - len(messages))
    return orjson.dumps({"model": model, "messages": messages})


EDGE_CASES: list[tuple[str, bytes, set[int]]] = [
    ("nested-200-fits", body_with(nested(200)), {200}),
    # Unchanged, it is forwarded byte for byte (orjson reads it), and the upstream refuses it as
    # providers do (the fake's 400, relayed); changed, it cannot be written: the gateway's 400.
    ("nested-300-forwarded-unchanged", body_with(nested(300)), {400}),
    (
        "nested-300-cannot-be-forwarded-changed",
        body_with(nested(300)).replace(
            b'"content":"hi"', b'"content":"hi","compactgate":{"pin":true}'
        ),
        {400},
    ),
    ("nested-10k", nested(10_000), {400}),
    ("nested-10k-arrays", body_with(b"[" * 10_000 + b"]" * 10_000), {400}),
    ("nested-1M", body_with(b"[" * 1_000_000 + b"]" * 1_000_000), {400}),
    (
        "nested-in-messages",
        b'{"model":"tiny","messages":[{"role":"user","content":"hi","x":' + nested(600) + b"}]}",
        {400},
    ),
    ("10k-messages-big", many_messages(10_000, "big"), {200}),
    ("10k-messages-ids-collide-and-dangle", many_messages(10_000, "tiny", paired=False), {200}),
    (
        "10k-messages-ids-collide-and-dangle-summary",
        many_messages(10_000, "tiny-summary", paired=False),
        {200},
    ),
    ("too-many-messages", many_messages(20_001, "big"), {400}),
    (
        "30MB-message",
        orjson.dumps({"model": "big", "messages": [{"role": "user", "content": "z" * 30_000_000}]}),
        {200},
    ),
    (
        "30MB-message-compacted",
        orjson.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": "word " * 6_000_000}]}
        ),
        {200, 400},  # 400: context_length_exceeded, when what must be kept cannot fit
    ),
    (
        "over-max-body",
        b'{"model":"big","messages":[{"role":"user","content":"' + b"y" * MAX_BODY + b'"}]}',
        {413},
    ),
    (
        "max_tokens-2**64",
        b'{"model":"tiny","max_tokens":18446744073709551616,"messages":[{"role":"user","content":"x"}]}',
        {400},
    ),
    (
        "max_tokens-2**63",
        b'{"model":"tiny","max_tokens":9223372036854775807,"messages":[{"role":"user","content":"x"}]}',
        {200, 400},
    ),
    (
        "number-1e400",
        b'{"model":"big","temperature":1e400,"messages":[{"role":"user","content":"x"}]}',
        {400},
    ),
    (
        "big-int-forwarded",
        b'{"model":"big","seed":123456789012345678901234567890,"messages":[{"role":"user","content":"x"}]}',
        {200},
    ),
    (
        "duplicate-model",
        b'{"model":"nope","model":"big","messages":[{"role":"user","content":"x"}]}',
        {200},
    ),
    ("escaped-nul", b'{"model":"tiny","messages":[{"role":"user","content":"a\\u0000b"}]}', {200}),
    ("raw-nul", b'{"model":"tiny","messages":[{"role":"user","content":"a\x00b"}]}', {400}),
    ("lone-surrogate", b'{"model":"tiny","messages":[{"role":"user","content":"\\ud800"}]}', {400}),
    ("invalid-utf8", b'{"model":"tiny","messages":[{"role":"user","content":"\xff\xfe"}]}', {400}),
    ("overlong-utf8", b'{"model":"tiny","messages":[{"role":"user","content":"\xc0\xaf"}]}', {400}),
    (
        "special-tokens",
        b'{"model":"tiny-tiktoken","messages":[{"role":"user","content":"<|endoftext|><|im_start|>'
        + b"<|endoftext|>" * 200
        + b'"}]}',
        {200, 400},
    ),
    ("empty", b"", {400}),
    ("null", b"null", {400}),
    ("unknown-role", b'{"model":"tiny","messages":[{"role":"wizard","content":"x"}]}', {400}),
    (
        "dangling-tool-result",
        b'{"model":"tiny","messages":[{"role":"tool","tool_call_id":"nope","content":"x"},{"role":"user","content":"x"}]}',
        {200},
    ),
]


@pytest.mark.parametrize(
    ("raw", "allowed"),
    [(raw, allowed) for _, raw, allowed in EDGE_CASES],
    ids=[c[0] for c in EDGE_CASES],
)
def test_edge_cases(
    gateway: GatewayProcess,
    fake_upstream: FakeUpstream,
    http: httpx.Client,
    raw: bytes,
    allowed: set[int],
) -> None:
    response = check(gateway, fake_upstream, http, raw)
    assert response.status_code in allowed, response.text[:500]


ROLE = {"role": ["user"], "content": "hi"}
ISSUE_39: list[tuple[str, str, Any]] = [
    # A `role` that is a list or an object (was 500: unhashable type).
    ("responses-role-list", "responses", {"model": "big", "input": [{**ROLE, "type": "message"}]}),
    ("responses-role-object", "responses", {"model": "big", "input": [{**ROLE, "role": {"a": 1}}]}),
    ("messages-role-list", "messages", {"model": "big", "max_tokens": 9, "messages": [ROLE]}),
    (
        "count-tokens-role-object",
        "count_tokens",
        {"model": "big", "messages": [{**ROLE, "role": {}}]},
    ),
    ("compact-role-list", "compact", {"model": "emulate", "input": [ROLE]}),
    ("chat-role-list", "chat", {"model": "big", "messages": [ROLE]}),
    # Nothing to compact (was 500: an error class built with a wrong argument).
    ("compact-empty-input", "compact", {"model": "emulate", "input": []}),
    ("compact-no-input", "compact", {"model": "emulate"}),
    ("bare-trigger", "responses", {"model": "emulate", "input": [{"type": "compaction_trigger"}]}),
]


@pytest.mark.parametrize(("api", "body"), [c[1:] for c in ISSUE_39], ids=[c[0] for c in ISSUE_39])
def test_the_bodies_that_were_answered_500(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, http: httpx.Client, api: str, body: Any
) -> None:
    response = check(gateway, fake_upstream, http, encode(body), api)
    assert response.status_code == 400, response.text


async def test_a_role_that_is_a_list_on_the_websocket_gets_a_400_frame(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    url = f"ws://127.0.0.1:{gateway.port}/v1/responses"
    async with connect(url, additional_headers={"authorization": "Bearer sk-fuzz"}) as socket:
        for item in (ROLE, {**ROLE, "role": {"a": 1}}):
            frame_text = encode({"type": "response.create", "model": "big", "input": [item]})
            await socket.send(frame_text.decode())
            frame = json.loads(await asyncio.wait_for(socket.recv(), 30))
            assert frame["type"] == "error" and frame["status"] == 400, frame
            assert frame["error"]["param"] == "input[0].role", frame
    assert fake_upstream.requests() == []


async def test_a_frame_over_the_body_limit_closes_its_socket_as_too_big_and_others_go_on(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """A frame larger than `server.max_body_bytes` closes that socket with 1009 (message too
    big, the WebSocket's 413), nothing reaches the upstream, and a new socket is answered."""
    fake_upstream.reset()
    url = f"ws://127.0.0.1:{gateway.port}/v1/responses"
    headers = {"authorization": "Bearer sk-fuzz"}
    huge = encode({"type": "response.create", "model": "big", "input": "z" * (MAX_BODY + 1)})
    async with connect(url, additional_headers=headers, max_size=None) as socket:
        await socket.send(huge.decode())
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(socket.recv(), 30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert fake_upstream.requests() == []
    async with connect(url, additional_headers=headers) as socket:
        await socket.send(
            encode({"type": "response.create", "model": "big", "input": "hi"}).decode()
        )
        answer: list[dict[str, Any]] = []
        while not answer or answer[-1].get("type") not in FINALS:
            answer.append(json.loads(await asyncio.wait_for(socket.recv(), 30)))
        assert answer[-1]["type"] == "response.completed"


@pytest.mark.parametrize("model", ["tiny", "tiny-summary", "tiny-tiktoken", "tiny-error"])
def test_10k_messages_are_compacted_to_fit(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, http: httpx.Client, model: str
) -> None:
    response = check(gateway, fake_upstream, http, many_messages(10_000, model))
    assert response.status_code == 200, response.text[:600]
    assert response.headers["x-compactgate-steps"] != "none"
    assert int(response.headers["x-compactgate-tokens-after"]) < 400  # the tiny window
    forwarded = [r["json"]["messages"] for r in fake_upstream.chat_requests()]
    assert any(
        m[-1] == {"role": "user", "content": "last"} for m in forwarded
    )  # not a summary call


def test_chunked_body_and_a_body_shorter_than_declared(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, http: httpx.Client
) -> None:
    body = b'{"model":"big","messages":[{"role":"user","content":"x"}]}'
    response = http.post(
        "/v1/chat/completions",
        content=iter([body[:10], body[10:]]),
        headers={"authorization": "Bearer sk-fuzz"},
    )
    assert response.status_code == 200  # chunked transfer encoding
    fake_upstream.reset()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n" + body
        )
        sock.shutdown(socket.SHUT_WR)  # the client gives up half way
        sock.recv(65536)
    time.sleep(0.2)
    assert fake_upstream.chat_requests() == []
    assert_still_serving(gateway)


# -- POST /v1/compress (design D9.10) -------------------------------------------------------------


@st.composite
def anthropic_messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Anthropic Messages as agentgateway sends them (no system): text, tool_use and
    tool_result blocks (ids may collide or dangle), thinking, cache_control markers."""
    out: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 5))):
        text = {"type": "text", "text": draw(texts)}
        if draw(st.booleans()):
            text["cache_control"] = {"type": "ephemeral"}
        out.append({"role": "user", "content": draw(st.sampled_from([draw(texts), [text]]))})
        ids = draw(st.lists(call_ids, max_size=2))
        blocks: list[dict[str, Any]] = [
            {"type": "tool_use", "id": i, "name": "read", "input": draw(json_values)} for i in ids
        ]
        if draw(st.booleans()):
            blocks.insert(0, {"type": "thinking", "thinking": draw(texts), "signature": "c2ln"})
        out.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "ok"}]})
        if ids:
            answered = ids if draw(st.booleans()) else draw(st.lists(call_ids, max_size=2))
            out.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": i, "content": draw(texts)}
                        for i in answered
                    ]
                    or [{"type": "text", "text": "-"}],
                }
            )
    out.append({"role": "user", "content": [{"type": "text", "text": draw(texts)}]})
    return out


@st.composite
def compress_bodies(draw: st.DrawFn) -> Any:
    """`{"messages", "model"}` with OpenAI chat or Anthropic messages, valid half the time, else
    with structural faults (`fuzz_strategies.mutated`; a fault may mix the two shapes)."""
    if draw(st.booleans()):
        messages = draw(chat_bodies())["messages"]
    else:
        messages = draw(anthropic_messages())
    body: Any = {"model": draw(st.sampled_from((*MODELS, "unknown"))), "messages": messages}
    return draw(mutated(st.just(body))) if draw(st.booleans()) else body


def _client_calls(fake: FakeUpstream) -> list[Any]:
    """Requests that came from a client, not the summaries an earlier example's request left
    being made in the background (they may reach the upstream after the next `reset`)."""
    return [r for r in fake.chat_requests() if not _summary_call(r.get("json"))]


def _summary_call(body: Any) -> bool:
    messages = body.get("messages") if isinstance(body, dict) else None
    first = messages[0] if isinstance(messages, list) and messages else None
    return isinstance(first, dict) and first.get("content") == SYSTEM_PROMPT


def check_compress(
    gateway: GatewayProcess, fake: FakeUpstream, http: httpx.Client, raw: bytes
) -> httpx.Response:
    """Never a 5xx (nothing is relayed here), a 4xx in OpenAI's shape, an answer in the
    contract's shape, nothing sent upstream but summaries, and the process alive."""
    fake.reset()
    response = http.post(
        "/compress",
        content=raw,
        headers={"content-type": "application/json", "authorization": "Bearer sk-fuzz"},
    )
    assert response.status_code < 500, (
        f"gateway {response.status_code}: {response.text[:500]}\n{gateway.output()[-4000:]}"
    )
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
    else:
        answer = response.json()
        assert set(answer) == {"messages", "tokens_saved"}
        assert isinstance(answer["messages"], list) and answer["messages"]
        assert isinstance(answer["tokens_saved"], int) and answer["tokens_saved"] >= 0
    assert _client_calls(fake) == []
    assert gateway.process.popen.poll() is None, gateway.output()[-3000:]
    return response


@FUZZ
@given(body=compress_bodies())
def test_compress_bodies(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, http: httpx.Client, body: Any
) -> None:
    check_compress(gateway, fake_upstream, http, encode(body))


@settings(FUZZ, max_examples=60)
@given(raw=mangled(compress_bodies()))
def test_compress_mangled_bytes(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, http: httpx.Client, raw: bytes
) -> None:
    check_compress(gateway, fake_upstream, http, raw)


def test_still_serving_after_the_fuzzing(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    assert_still_serving(gateway)
    assert "Traceback" not in gateway.output(), gateway.output()[-5000:]
