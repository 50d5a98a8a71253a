"""The fake upstream itself: the official openai client parses it, scripts do what they say,
recordings are byte-faithful, and its provider-styled context errors are the ones the gateway's
table recognises."""

from __future__ import annotations

import base64
import math
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from gateway.wire.context_errors import classify
from tests.conftest import ProcessStartError, Starter
from tests.fake_upstream import STYLES, FakeUpstream, render_context_error

USER = [{"role": "user", "content": "hello fake"}]


def _prompt_tokens(messages: list[dict[str, object]], ratio: float = 4.0) -> int:
    return math.ceil(len(orjson.dumps([messages, []]).decode()) / ratio)


@pytest.fixture
def client(fake_upstream: FakeUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=fake_upstream.base_url, api_key="sk-test", max_retries=0, timeout=10
    ) as client:
        yield client


@pytest.fixture
def http(fake_upstream: FakeUpstream) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake_upstream.base_url, timeout=10) as http:
        yield http


def test_non_streaming_completion(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="m-1", messages=USER)  # type: ignore[arg-type]
    assert completion.id.startswith("chatcmpl-") and completion.object == "chat.completion"
    assert completion.model == "m-1"
    assert completion.choices[0].message.content == "echo: hello fake"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == _prompt_tokens(USER)
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


def test_streaming_completion_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m",
        messages=USER,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    with stream:
        chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: hello fake"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_without_usage_has_no_usage_chunk(http: httpx.Client) -> None:
    raw = http.post("/chat/completions", json={"model": "m", "messages": USER, "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = [e for e in raw.content.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events) and events[-1] == b"data: [DONE]"
    assert b'"usage"' not in raw.content


def test_recordings_are_byte_faithful(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    body = b'{ "model":"m",  "messages":[{"role":"user","content":"h\\u00e9 \xc3\xa9"}],"x":1}'
    http.post(
        "/chat/completions?trace=1",
        content=body,
        headers={"X-Custom": "v1", "Authorization": "Bearer sk-abc"},
    )
    (record,) = fake_upstream.requests()
    assert base64.b64decode(record["body_b64"]) == body
    assert record["json"]["x"] == 1 and record["method"] == "POST"
    assert record["path"] == "/v1/chat/completions" and record["query"] == "trace=1"
    headers = {name.lower(): value for name, value in record["headers"]}
    assert headers["x-custom"] == "v1" and headers["authorization"] == "Bearer sk-abc"


def test_tool_calls_script_streaming_and_not(
    fake_upstream: FakeUpstream, client: openai.OpenAI
) -> None:
    call = {"id": "call_1", "function": {"name": "read_file", "arguments": {"path": "a.py"}}}
    fake_upstream.script([{"kind": "tool_calls", "tool_calls": [call]}] * 2)
    completion = client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    (parsed,) = completion.choices[0].message.tool_calls or []
    assert completion.choices[0].finish_reason == "tool_calls"
    assert parsed.id == "call_1" and parsed.function.name == "read_file"  # type: ignore[union-attr]
    assert orjson.loads(parsed.function.arguments) == {"path": "a.py"}  # type: ignore[union-attr]

    with client.chat.completions.create(model="m", messages=USER, stream=True) as stream:  # type: ignore[arg-type]
        chunks = list(stream)
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id == "call_1" and deltas[0].function.name == "read_file"  # type: ignore[union-attr]
    arguments = "".join(d.function.arguments or "" for d in deltas)  # type: ignore[union-attr]
    assert orjson.loads(arguments) == {"path": "a.py"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_error_script_keeps_status_headers_and_body(
    fake_upstream: FakeUpstream, http: httpx.Client, client: openai.OpenAI
) -> None:
    fake_upstream.script(
        [
            {"kind": "error", "status": 429, "raw": "slow down\n", "headers": {"Retry-After": "2"}},
            {"kind": "error", "status": 500, "body": {"error": {"message": "boom"}}},
        ]
    )
    first = http.post("/chat/completions", json={"model": "m", "messages": USER})
    assert (first.status_code, first.content) == (429, b"slow down\n")
    assert first.headers["retry-after"] == "2"
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    assert raised.value.status_code == 500
    assert client.chat.completions.create(model="m", messages=USER).choices  # type: ignore[arg-type]
    assert len(fake_upstream.chat_requests()) == 3


def test_reset_clears_script_and_records(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.script([{"kind": "error", "status": 500}])
    http.get("/models")
    fake_upstream.reset()
    assert fake_upstream.requests() == []
    assert http.post("/chat/completions", json={"model": "m", "messages": USER}).status_code == 200


@pytest.mark.parametrize("style", STYLES)
def test_context_limit_script_speaks_each_provider(
    fake_upstream: FakeUpstream, http: httpx.Client, style: str
) -> None:
    long = [{"role": "user", "content": "word " * 200}]
    fake_upstream.script([{"kind": "context_limit", "limit": 100, "style": style}] * 2)
    refused = http.post("/chat/completions", json={"model": "m", "messages": long})
    result = classify(refused.status_code, refused.content)
    assert result is not None
    assert result.signature == ("openai" if style == "azure" else style)
    if style != "bedrock":  # Bedrock's body states no numbers
        assert (result.limit, result.requested) == (100, _prompt_tokens(long))
    accepted = http.post("/chat/completions", json={"model": "m", "messages": USER})
    assert accepted.status_code == 200


@pytest.mark.parametrize("style", STYLES)
def test_rendered_errors_state_the_prompt_not_the_reservation(style: str) -> None:
    """With max_tokens set, llama-cpp-python's body is OpenAI's older wording: read as openai."""
    status, _, body = render_context_error(style, 1000, 1200, 300)
    result = classify(status, body)
    assert result is not None
    same_as_openai = style in ("azure", "llama-cpp-python")
    assert result.signature == ("openai" if same_as_openai else style)
    if style != "bedrock":
        assert (result.limit, result.requested) == (1000, 1200)
    assert result.reserved_output in (None, 300)


def test_global_config_limit_and_usage_tokenizer(
    fake_upstream: FakeUpstream, client: openai.OpenAI
) -> None:
    fake_upstream.configure(
        {"context_limit": 50, "style": "llamacpp", "usage_tokenizer": "chars:3.1"}
    )
    fake_upstream.script([{"kind": "error", "status": 500}])  # not consumed by a refusal
    long = [{"role": "user", "content": "x" * 400}]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="m", messages=long)  # type: ignore[arg-type]
    refusal = classify(400, raised.value.response.content)
    assert refusal is not None and refusal.signature == "llamacpp"
    assert (refusal.limit, refusal.requested) == (50, _prompt_tokens(long, 3.1))
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    completion = client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == _prompt_tokens(USER, 3.1)
    with pytest.raises(httpx.HTTPStatusError):
        fake_upstream.configure({"usage_tokenizer": "words"})


def test_client_disconnect_cancels_a_hung_request(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script([{"kind": "hang_before_headers", "seconds": 30}])
    with (
        openai.OpenAI(
            base_url=fake_upstream.base_url, api_key="k", max_retries=0, timeout=0.5
        ) as impatient,
        pytest.raises(openai.APITimeoutError),
    ):
        impatient.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    deadline = time.monotonic() + 5
    while fake_upstream.inflight()["cancelled"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake_upstream.inflight() == {"inflight": 0, "started": 1, "completed": 0, "cancelled": 1}


def test_drops_and_mid_stream_failures(fake_upstream: FakeUpstream, client: openai.OpenAI) -> None:
    fake_upstream.script(
        [
            {"kind": "drop"},
            {"kind": "drop_mid_stream", "after_chunks": 2},
            {"kind": "hang_mid_stream", "after_chunks": 2, "seconds": 0.3},
        ]
    )
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    with client.chat.completions.create(model="m", messages=USER, stream=True) as stream:  # type: ignore[arg-type]
        received = []
        with pytest.raises(httpx.RemoteProtocolError):
            for chunk in stream:
                received.append(chunk)
    assert len(received) == 2
    started = time.monotonic()
    with client.chat.completions.create(model="m", messages=USER, stream=True) as stream:  # type: ignore[arg-type]
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert time.monotonic() - started >= 0.3
    counters = fake_upstream.wait_idle()
    assert counters["cancelled"] == 0  # our own drops are not client disconnects


def test_stream_error_event_empty_200_and_slow_stream(
    fake_upstream: FakeUpstream, http: httpx.Client
) -> None:
    error = {"error": {"message": "boom", "type": "server_error"}}
    fake_upstream.script(
        [
            {"kind": "stream_error_event", "body": error},
            {"kind": "empty_200"},
            {"kind": "slow_stream", "chunks": 3, "interval": 0.05},
        ]
    )
    request = {"model": "m", "messages": USER, "stream": True}
    event = http.post("/chat/completions", json=request)
    assert (event.status_code, event.content) == (200, b"data: " + orjson.dumps(error) + b"\n\n")
    empty = http.post("/chat/completions", json=request)
    assert (empty.status_code, empty.content) == (200, b"")
    assert empty.headers["content-type"].startswith("text/event-stream")
    slow = http.post("/chat/completions", json=request)
    contents = [
        orjson.loads(e[6:])["choices"][0]["delta"].get("content")
        for e in slow.content.split(b"\n\n")
        if e.startswith(b"data: {") and orjson.loads(e[6:])["choices"]
    ]
    assert len([c for c in contents if c]) == 3


def test_models_embeddings_and_other_paths(client: openai.OpenAI, http: httpx.Client) -> None:
    assert [m.id for m in client.models.list()] == ["fake-model"]
    embedding = client.embeddings.create(model="e", input="hi")
    assert embedding.data[0].embedding == [0.0, 0.1, 0.2]
    other = http.get("/files/abc", params={"purpose": "x"})
    assert other.json()["path"] == "/v1/files/abc" and other.json()["query"] == "purpose=x"


def test_start_process_reports_early_exit_and_timeouts(start_process: Starter) -> None:
    with pytest.raises(ProcessStartError, match="exited with 3"):
        start_process([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], "READY", 10)
    with pytest.raises(ProcessStartError, match="no line matching"):
        start_process([sys.executable, "-c", "import time; time.sleep(30)"], "READY", 0.3)
