"""The proxy: the gateway, the fake upstream and the official openai client.

What a user would notice: with no compaction needed, the client cannot tell the gateway from
the upstream; the upstream receives exactly what the client sent; every bad input is a clear
OpenAI error with nothing sent upstream; a client that hangs up cancels the upstream call.

Most of it runs in-process (tests/in_process.py, a gateway app per test); a stream relayed over
the wire and a client hanging up mid-stream need a real `compactgate serve`, shared by the module.
"""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import GatewayProcess, free_port
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process
from tests.in_process import AppGateway, AppStarter, LocalUpstream

SMALL = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hi."},
]


def config_for(fake: FakeUpstream | LocalUpstream, **model: Any) -> dict[str, Any]:
    entry = {
        "name": "m",
        "upstream": {"base_url": fake.base_url},
        "context_window": 100_000,
        **model,
    }
    return {"server": {"max_body_bytes": 200_000}, "models": [entry]}


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """The real process, for what only the wire shows."""
    with gateway_process(
        config_for(fake_upstream_server), tmp_path_factory.mktemp("proxy")
    ) as process:
        yield process


@pytest.fixture
async def app(start_app: AppStarter, local_upstream: LocalUpstream) -> AppGateway:
    return await start_app(config_for(local_upstream))


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="sk-client", max_retries=0, timeout=20)


def direct_client(upstream: LocalUpstream) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=upstream.base_url, api_key="sk-client", max_retries=0, timeout=20
    )


def without_volatile(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k not in ("id", "created")}


async def test_non_streaming_response_is_what_the_upstream_returned(
    app: AppGateway, local_upstream: LocalUpstream
) -> None:
    local_upstream.script(
        [{"kind": "ok", "content": "hi there"}, {"kind": "ok", "content": "hi there"}]
    )
    async with direct_client(local_upstream) as upstream_client:
        direct = await upstream_client.chat.completions.create(model="m", messages=SMALL)
    via = await app.openai().chat.completions.with_raw_response.create(model="m", messages=SMALL)
    assert without_volatile(via.parse().model_dump()) == without_volatile(direct.model_dump())
    assert via.headers["x-compactgate-steps"] == "none"
    assert via.headers["x-compactgate-retries"] == "0"
    assert (
        int(via.headers["x-compactgate-tokens-before"])
        == int(via.headers["x-compactgate-tokens-after"])
        > 0
    )
    assert via.headers["x-compactgate-request-id"]


def test_streaming_chunks_are_relayed_unchanged(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script([{"kind": "ok", "content": "one two three"}] * 2)
    body = {"model": "m", "messages": SMALL, "stream": True}
    direct = httpx.post(f"{fake_upstream.base_url}/chat/completions", json=body, timeout=20)
    with httpx.stream(
        "POST", f"{gateway.base_url}/chat/completions", json=body, timeout=20
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-compactgate-steps"] == "none"
        relayed = b"".join(response.iter_bytes())

    def events(raw: bytes) -> list[Any]:
        out = []
        for block in raw.split(b"\n\n"):
            if block.startswith(b"data: ") and block != b"data: [DONE]":
                out.append(without_volatile(orjson.loads(block[6:])))
            elif block:
                out.append(block)
        return out

    assert events(relayed) == events(direct.content)
    assert relayed.endswith(b"data: [DONE]\n\n")
    stream = client(gateway.base_url).chat.completions.create(
        model="m", messages=SMALL, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text  # the official client parses the relayed stream


async def test_upstream_receives_the_clients_exact_bytes(
    app: AppGateway, local_upstream: LocalUpstream
) -> None:
    raw = (
        b'{"model":"m","messages":[{"role":"user","content":"x\\u00e9 \xf0\x9f\x98\x80"}],'
        b'"temperature":0.25,"x_unknown_field":{"nested":[1,2,{"a":null}]},"logit_bias":{"50256":-100}}'
    )
    response = await app.http.post(
        f"{app.base_url}/chat/completions",
        content=raw,
        headers={
            "content-type": "application/json",
            "authorization": "Bearer sk-abc",
            "x-custom": "kept",
        },
    )
    assert response.status_code == 200
    [recorded] = local_upstream.chat_requests()
    assert base64.b64decode(recorded["body_b64"]) == raw
    headers = {k.lower(): v for k, v in recorded["headers"]}
    assert headers["authorization"] == "Bearer sk-abc"
    assert headers["x-custom"] == "kept"


async def test_rename_and_extension_change_only_those_fields(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        config_for(
            local_upstream, upstream={"base_url": local_upstream.base_url, "model": "real-name"}
        )
    )
    messages = [{"role": "user", "content": "hello", "compactgate": {"pin": True}}]
    body = {
        "model": "m",
        "messages": messages,
        "seed": 7,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    }
    assert (await gw.http.post(f"{gw.base_url}/chat/completions", json=body)).status_code == 200
    [recorded] = local_upstream.chat_requests()
    assert recorded["json"] == {
        **body,
        "model": "real-name",
        "messages": [{"role": "user", "content": "hello"}],
    }


async def test_gateway_held_key_replaces_the_client_key(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        config_for(
            local_upstream, upstream={"base_url": local_upstream.base_url, "api_key": "${GW_KEY}"}
        ),
        env={"GW_KEY": "sk-gateway"},
    )
    await gw.openai().chat.completions.create(model="m", messages=SMALL)
    [recorded] = local_upstream.chat_requests()
    assert (
        dict((k.lower(), v) for k, v in recorded["headers"])["authorization"] == "Bearer sk-gateway"
    )
    assert "sk-gateway" not in gw.logs()


async def test_upstream_errors_keep_their_status_and_body(
    app: AppGateway, local_upstream: LocalUpstream
) -> None:
    body = {
        "error": {
            "message": "Incorrect API key provided",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    local_upstream.script([{"kind": "error", "status": 401, "body": body}])
    response = await app.http.post(
        f"{app.base_url}/chat/completions", json={"model": "m", "messages": SMALL}
    )
    assert response.status_code == 401
    assert response.json() == body
    with pytest.raises(openai.AuthenticationError):
        local_upstream.script([{"kind": "error", "status": 401, "body": body}])
        await app.openai().chat.completions.create(model="m", messages=SMALL)


@pytest.mark.parametrize(
    ("raw", "status", "param", "code"),
    [
        (b"{not json", 400, None, None),
        (b'{"model": "m"}', 400, "messages", None),
        (b'{"model": "m", "messages": "hi"}', 400, "messages", None),
        (b'{"model": "m", "messages": []}', 400, "messages", None),
        (
            b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}',
            400,
            "messages[0].role",
            None,
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": {"a": 1}}]}',
            400,
            "messages[0].content",
            None,
        ),
        (
            b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "model",
            "model_not_found",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 250_000 + b'"}]}',
            413,
            None,
            "request_too_large",
        ),
    ],
    ids=[
        "invalid-json",
        "no-messages",
        "messages-not-list",
        "messages-empty",
        "unknown-role",
        "bad-content",
        "unknown-model",
        "too-large",
    ],
)
async def test_bad_input_is_a_clear_error_and_nothing_goes_upstream(
    app: AppGateway,
    local_upstream: LocalUpstream,
    raw: bytes,
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    response = await app.http.post(
        f"{app.base_url}/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert local_upstream.chat_requests() == []
    # the worker keeps serving
    assert (await app.openai().chat.completions.create(model="m", messages=SMALL)).choices


async def test_upstream_unreachable_is_502(start_app: AppStarter) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    gw = await start_app(
        {
            "models": [
                {
                    "name": "m",
                    "upstream": {"base_url": dead},
                    "context_window": 8000,
                    "retry": {"max_attempts": 1},
                }
            ]
        }
    )
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai().chat.completions.create(model="m", messages=SMALL)
    assert info.value.status_code == 502
    assert info.value.body["code"] == "upstream_unreachable"


@pytest.mark.slow
async def test_upstream_timeout_is_504(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    config = config_for(local_upstream)
    config["server"] = {"upstream_timeout_s": 1, "first_byte_timeout_s": 1}
    gw = await start_app(config)
    local_upstream.script([{"kind": "hang_before_headers", "seconds": 5}])
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai().chat.completions.create(model="m", messages=SMALL)
    assert info.value.status_code == 504
    assert info.value.body["code"] == "upstream_timeout"
    assert time.monotonic() - started < 4


def _upstream_call_dropped(gateway: GatewayProcess, fake_upstream: FakeUpstream) -> None:
    """The one upstream call was cancelled within 5 s, and the gateway goes on serving."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and fake_upstream.inflight()["cancelled"] < 1:
        time.sleep(0.02)
    counters = fake_upstream.inflight()
    assert counters["cancelled"] == 1
    assert counters["inflight"] == 0
    assert client(gateway.base_url).chat.completions.create(model="m", messages=SMALL).choices


def test_client_disconnect_mid_stream_cancels_the_upstream_request(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script([{"kind": "slow_stream", "chunks": 50, "interval": 0.1}])
    body = {"model": "m", "messages": SMALL, "stream": True}
    with httpx.stream(
        "POST", f"{gateway.base_url}/chat/completions", json=body, timeout=20
    ) as response:
        for _ in response.iter_raw():
            break  # first chunk arrived: hang up
    _upstream_call_dropped(gateway, fake_upstream)


def test_a_client_hanging_up_before_the_watch_begins_still_cancels_the_upstream_request(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """The gateway listens for a hang-up only once an answer has run `WATCH_AFTER_S` (0.1 s); a client
    gone before that (here as soon as its call reached the upstream) is still seen then, and
    its upstream call dropped, not left to run."""
    fake_upstream.script([{"kind": "hang_before_headers", "seconds": 30}])
    body = orjson.dumps({"model": "m", "messages": SMALL})
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(head.encode() + body)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and fake_upstream.inflight()["inflight"] < 1:
            time.sleep(0.005)
    _upstream_call_dropped(gateway, fake_upstream)


async def test_models_list_and_passthrough(app: AppGateway, local_upstream: LocalUpstream) -> None:
    models = await app.openai().models.list()
    assert [m.id for m in models.data] == ["m"]
    embedding = await app.openai().embeddings.create(model="m", input="hello")
    assert embedding.data[0].embedding
    response = await app.http.get(f"{app.base_url}/files/abc?purpose=x")
    assert response.status_code == 200
    recorded = local_upstream.requests()[-1]
    assert recorded["path"] == "/v1/files/abc" and recorded["query"] == "purpose=x"


async def test_models_report_the_window_they_are_compacted_to(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """An agent that sizes its own compaction from the model list sees the gateway's window
    (a window learned from an upstream error included), in the OpenAI and Anthropic shapes."""
    app = await start_app(config_for(local_upstream, max_output_tokens=4000))
    [model] = (await app.openai().models.list()).data
    extra = model.model_extra or {}
    assert extra["context_window"] == extra["context_length"] == extra["max_model_len"] == 100_000
    assert extra["max_input_tokens"] == 96_000 and extra["max_output_tokens"] == 4000
    anthropic_list = (
        await app.http.get(f"{app.base_url}/models", headers={"anthropic-version": "2023-06-01"})
    ).json()
    assert anthropic_list["has_more"] is False and anthropic_list["first_id"] == "m"
    [entry] = anthropic_list["data"]
    assert entry["type"] == "model" and entry["max_input_tokens"] == 96_000
    assert entry["created_at"].endswith("Z")


async def test_health_and_metrics(app: AppGateway) -> None:
    await app.openai().chat.completions.create(model="m", messages=SMALL)
    health = (await app.http.get(f"{app.url}/healthz")).json()
    assert health["status"] == "ok" and health["upstreams"]["models"]["m"]["reachable"]
    assert (await app.http.get(f"{app.url}/readyz")).status_code == 200
    text = (await app.http.get(f"{app.url}/metrics")).text
    assert 'compactgate_requests_total{api="chat",model="m",status="200"} 1.0' in text
    assert "compactgate_request_duration_seconds_bucket" in text
    assert "compactgate_upstream_duration_seconds_bucket" in text
