"""Hostile input against a real gateway process (design D15.3): it never answers with its own
5xx, never crashes, and keeps serving.

Hypothesis builds chat-completion bodies that are wrong at every level (types, huge numbers,
unknown roles, content parts, tool calls whose ids collide or dangle, extension marks, unknown
fields) and then mangles some of them at the byte level (invalid UTF-8, raw NUL bytes, duplicate
keys, truncation); a table adds the cases too big to generate (10,000 levels of nesting and a
million, 10,000 messages, a 30 MB message). Models with a tiny window send the survivors through
the policy chains (including a summarising one) rather than straight upstream.

For every answer: the status is below 500 unless it is the fake upstream's own status relayed
(`x-compactgate-steps` is only on relayed answers); the gateway's own 4xx is an OpenAI error body;
a request refused as invalid sent nothing upstream; the process is alive and serves a normal
request afterwards. Bounded: the whole module runs in well under 90 s.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.summaries.transcript import SYSTEM_PROMPT
from tests.conftest import GatewayProcess
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process

MAX_BODY = 40 * 1024 * 1024
MODELS = ("big", "tiny", "tiny-summary", "tiny-error", "tiny-tiktoken")
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    base = fake_upstream_server.base_url

    def tiny(name: str, policy: str, tokenizer: str = "chars:4") -> dict[str, Any]:
        return {
            "name": name,
            "upstream": {"base_url": base},
            "context_window": 400,
            "max_output_tokens": 64,
            "tokenizer": tokenizer,
            "policy": policy,
            "retry": {"max_attempts": 1},
        }

    config = {
        "server": {"max_body_bytes": MAX_BODY, "body_read_timeout_s": 30},
        "models": [
            {
                "name": "big",
                "upstream": {"base_url": base},
                "context_window": 100_000_000,
                "tokenizer": "chars:4",
                "retry": {"max_attempts": 1},
            },
            tiny("tiny", "default"),
            tiny("tiny-summary", "summary"),
            tiny("tiny-error", "strict"),
            tiny("tiny-tiktoken", "default", "tiktoken:o200k_base"),
        ],
        "policies": {
            "summary": {
                "steps": [{"type": "tool_output_cache"}, {"type": "sandwich"}, {"type": "fifo"}]
            },
            "strict": {"recovery_mode": "error", "steps": [{"type": "fifo"}]},
        },
    }
    with gateway_process(config, tmp_path_factory.mktemp("fuzz")) as gw:
        yield gw


@pytest.fixture(scope="module")
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.base_url, timeout=60) as client:
        yield client


# -- strategies --------------------------------------------------------------------------------

TRICKY_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "<|endoftext|>",
    "<|im_start|>system",
    "\u202e\u2066",
    "\ufeff",
    "𝕏" * 40,
    "ä" * 300,
    "\n" * 200,
    "{" * 300,
    "word " * 600,
    "x" * 5000,
    "```python\nprint(1)\n```",
    '{"json": [1, 2, {"deep": true}]}',
    "Traceback (most recent call last):\n" * 50,
]
texts = st.one_of(st.text(max_size=60), st.sampled_from(TRICKY_TEXT))
huge_numbers = st.sampled_from(
    [2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, -(2**63) - 1, 1e308, -1e308, 5e-324, -0.0]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    huge_numbers,
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
call_ids = st.sampled_from(
    ["call_1", "call_2", "call_3", "call_1 ", ""]
)  # a small pool: ids collide
marks = st.fixed_dictionaries(
    {},
    optional={
        "pin": st.booleans(),
        "priority": st.integers(1, 3),
        "type": st.sampled_from(["message", "code", "plan_ref", "log", "other"]),
    },
)


@st.composite
def user_message(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        content: Any = draw(texts)
    else:
        parts = [{"type": "text", "text": draw(texts)}]
        if draw(st.booleans()):
            parts.append(
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
            )
        content = parts
    message = {"role": "user", "content": content}
    if draw(st.booleans()):
        message["compactgate"] = draw(marks)
    return message


@st.composite
def turn(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A user message, maybe rounds of tool calls and results (ids may collide or dangle), and an
    assistant answer."""
    out = [draw(user_message())]
    for _ in range(draw(st.integers(0, 2))):
        ids = draw(st.lists(call_ids, min_size=1, max_size=3))
        calls = [
            {
                "id": i,
                "type": "function",
                "function": {
                    "name": draw(st.sampled_from(["read", "grep", ""])),
                    "arguments": draw(texts),
                },
            }
            for i in ids
        ]
        out.append({"role": "assistant", "content": draw(st.none() | texts), "tool_calls": calls})
        for i in draw(st.lists(call_ids, max_size=3)) if draw(st.booleans()) else ids:
            out.append({"role": "tool", "tool_call_id": i, "content": draw(texts)})
    if draw(st.booleans()):
        out.append({"role": "assistant", "content": draw(texts)})
    return out


@st.composite
def valid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append(
            {"role": draw(st.sampled_from(["system", "developer"])), "content": draw(texts)}
        )
    for t in draw(st.lists(turn(), min_size=1, max_size=6)):
        messages += t
    body: dict[str, Any] = {"model": draw(st.sampled_from(MODELS)), "messages": messages}
    if draw(st.booleans()):
        body["stream"] = True
        if draw(st.booleans()):
            body["stream_options"] = {"include_usage": draw(st.booleans())}
    if draw(st.booleans()):
        body[draw(st.sampled_from(["max_tokens", "max_completion_tokens"]))] = draw(
            st.integers(1, 300)
        )
    if draw(st.booleans()):
        body["tools"] = [
            {"type": "function", "function": {"name": "read", "parameters": draw(json_values)}}
        ]
    return body


@st.composite
def bodies(draw: st.DrawFn) -> Any:
    """A valid body (a third of the time) or one with one to three faults at random places: a
    value of another type or size, a key removed, an unknown key added."""
    body: Any = draw(valid_bodies())
    for _ in range(draw(st.integers(0, 3)) if draw(st.integers(0, 2)) else 0):
        places = list(_places(body, ()))
        path = draw(st.sampled_from(places))
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        body = _apply(body, path, action, draw(json_values), draw(st.text(max_size=12)))
    return body


def _places(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _places(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _places(child, (*path, index))


def _apply(root: Any, path: tuple[Any, ...], action: str, value: Any, key: str) -> Any:
    if not path:
        return value if action == "replace" else root
    parent = root
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "replace":
        parent[last] = value
    elif action == "delete":
        del parent[last]
    elif isinstance(parent[last], dict):
        parent[last][key] = value
    elif isinstance(parent[last], list):
        parent[last].append(value)
    return root


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    """A serialised body, then damaged the way a broken client or an attacker would."""
    raw = encode(draw(bodies()))
    kind = draw(st.sampled_from(["utf8", "nul", "duplicate", "truncate", "bytes", "wrap"]))
    at = draw(st.integers(0, len(raw)))
    if kind == "utf8":
        bad = draw(
            st.sampled_from(
                [
                    b"\xff",
                    b"\xc3\x28",
                    b"\xed\xa0\x80",
                    b"\xf4\x90\x80\x80",
                    b"\xc0\xaf",
                    b"\xe2\x82",
                ]
            )
        )
        return raw[:at] + bad + raw[at:]
    if kind == "nul":
        return raw[:at] + b"\x00" + raw[at:]
    if kind == "duplicate":
        key = draw(st.sampled_from([b'"model":', b'"messages":', b'"stream":', b'"max_tokens":']))
        value = encode(draw(json_values))
        return raw[:1] + key + value + b"," + raw[1:]
    if kind == "truncate":
        return raw[:at]
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    return draw(st.sampled_from([b"\xef\xbb\xbf", b" \n\t", b"[", b"null"])) + raw


def encode(value: Any) -> bytes:
    """JSON as a client would send it; unlike orjson, integers beyond 64 bits are allowed."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode()


# -- the checks ---------------------------------------------------------------------------------


def check(
    gateway: GatewayProcess,
    fake: FakeUpstream,
    http: httpx.Client,
    raw: bytes,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    fake.reset()
    response = http.post(
        "/chat/completions",
        content=raw,
        headers={
            "content-type": "application/json",
            "authorization": "Bearer sk-fuzz",
            **(headers or {}),
        },
    )
    relayed = "x-compactgate-steps" in response.headers
    assert response.status_code < 500 or relayed, (
        f"gateway {response.status_code}: {response.text[:500]}\n{gateway.output()[-4000:]}"
    )
    if response.status_code >= 400 and not relayed:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
        assert error["param"] is None or isinstance(error["param"], str)
        assert error["code"] is None or isinstance(error["code"], str)
        if error["code"] != "context_length_exceeded":  # refused as invalid: nothing went upstream
            assert _client_calls(fake) == [], error
    elif response.status_code == 200:
        if response.headers["content-type"].startswith("text/event-stream"):
            assert response.content.endswith(b"data: [DONE]\n\n")
        else:
            assert "choices" in response.json()
    assert gateway.process.popen.poll() is None, gateway.output()[-3000:]
    return response


def _client_calls(fake: FakeUpstream) -> list[Any]:
    """Chat requests that came from a client, not the summaries an earlier example's request
    left being made in the background (they may reach the upstream after the next `reset`)."""
    return [r for r in fake.chat_requests() if not _summary_call(r.get("json"))]


def _summary_call(body: Any) -> bool:
    messages = body.get("messages") if isinstance(body, dict) else None
    first = messages[0] if isinstance(messages, list) and messages else None
    return isinstance(first, dict) and first.get("content") == SYSTEM_PROMPT


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


@FUZZ
@given(body=bodies())
def test_structured_bodies(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, http: httpx.Client, body: dict[str, Any]
) -> None:
    check(gateway, fake_upstream, http, encode(body))


@FUZZ
@given(raw=mangled())
def test_mangled_bytes(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, http: httpx.Client, raw: bytes
) -> None:
    response = check(gateway, fake_upstream, http, raw)
    assert response.status_code == 200 or response.status_code < 500


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
    # Unchanged, it is forwarded byte for byte (orjson reads it); changed, it cannot be written.
    ("nested-300-forwarded-unchanged", body_with(nested(300)), {200}),
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


@pytest.mark.parametrize("model", ["tiny", "tiny-summary", "tiny-tiktoken", "tiny-error"])
def test_10k_messages_are_compacted_to_fit(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, http: httpx.Client, model: str
) -> None:
    response = check(gateway, fake_upstream, http, many_messages(10_000, model))
    assert response.status_code == 200
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
        "/chat/completions",
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


def test_still_serving_after_the_fuzzing(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    assert_still_serving(gateway)
    assert "Traceback" not in gateway.output(), gateway.output()[-5000:]
