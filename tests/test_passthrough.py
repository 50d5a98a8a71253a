"""Everything the gateway forwards without compacting: `/v1/embeddings` and any other `/v1/*`
path, `GET /v1/models/{id}`, and what browsers need (CORS) on every path.

What a user would notice: a renamed model works on every path (the upstream gets its upstream
name); retrieving a model answers for that model; a browser's cookies and the client's own key
never reach the upstream when the gateway supplies one; a page on an allowed origin can call the
gateway and one on another origin cannot; and each forwarded request is counted and logged.
All in-process (tests/in_process.py); what only a real server shows (its own `date` and `server`
headers) is in tests/test_request_log.py.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.config import ConfigError, parse_config
from tests.conftest import GatewayStarter, free_port
from tests.fake_upstream import FakeUpstream
from tests.in_process import AppGateway, AppStarter, LocalUpstream


def models(fake: LocalUpstream, **first: Any) -> dict[str, Any]:
    entry = {"name": "m", "upstream": {"base_url": fake.base_url}, "context_window": 100_000}
    return {"models": [{**entry, **first}]}


def headers_of(record: dict[str, Any]) -> dict[str, str]:
    return {k.lower(): v for k, v in record["headers"]}


# -- renamed models ----------------------------------------------------------------------------


async def test_a_renamed_model_reaches_the_upstream_under_its_upstream_name(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        models(
            local_upstream,
            name="embed",
            upstream={"base_url": local_upstream.base_url, "model": "text-embedding-3-small"},
        )
    )
    embedding = await gw.openai().embeddings.create(
        model="embed", input="hello", dimensions=3, encoding_format="float"
    )
    assert embedding.data[0].embedding
    legacy = await gw.http.post(
        f"{gw.base_url}/completions", json={"model": "embed", "prompt": "hi", "max_tokens": 1}
    )
    assert legacy.status_code == 200
    sent = [r["json"] for r in local_upstream.requests()]
    assert sent == [
        {
            "model": "text-embedding-3-small",
            "input": "hello",
            "dimensions": 3,
            "encoding_format": "float",
        },
        {"model": "text-embedding-3-small", "prompt": "hi", "max_tokens": 1},
    ]


async def test_a_body_naming_no_renamed_model_is_forwarded_byte_for_byte(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        models(local_upstream, upstream={"base_url": local_upstream.base_url, "model": "real"})
    )
    raw = b'{"model":"something-else","input":"x","extra":1.50}'
    response = await gw.http.post(
        f"{gw.base_url}/embeddings", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    [recorded] = local_upstream.requests()
    assert base64.b64decode(recorded["body_b64"]) == raw


# -- GET /v1/models/{id} -----------------------------------------------------------------------


async def test_retrieving_a_configured_model_answers_its_own_entry(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    async with LocalUpstream.serve() as other:
        gw = await start_app(
            {
                "models": [
                    {"name": "first", "upstream": {"base_url": local_upstream.base_url}},
                    {
                        "name": "second",
                        "upstream": {"base_url": other.base_url, "model": "real-second"},
                        "context_window": 8000,
                        "max_output_tokens": 1000,
                    },
                ]
            }
        )
        retrieved = await gw.openai().models.retrieve("second")
        listed = {m.id: m for m in (await gw.openai().models.list()).data}
        assert retrieved.id == "second"
        assert retrieved.model_dump() == listed["second"].model_dump()
        assert (retrieved.model_extra or {})["context_window"] == 8000
        assert (retrieved.model_extra or {})["max_input_tokens"] == 7000
        claude = await gw.anthropic().models.retrieve("second")
        assert claude.id == "second" and claude.type == "model"
        assert local_upstream.requests() == [] and other.requests() == []


async def test_retrieving_an_unknown_model_is_a_404_in_the_clients_shape(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(models(local_upstream))
    with pytest.raises(openai.NotFoundError) as info:
        await gw.openai().models.retrieve("nope")
    body = info.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_found"
    assert body["type"] == "invalid_request_error" and "nope" in body["message"]
    with pytest.raises(anthropic.NotFoundError) as claude:
        await gw.anthropic().models.retrieve("nope")
    assert claude.value.body["type"] == "error"  # type: ignore[index]
    assert claude.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert local_upstream.requests() == []


async def test_retrieving_a_glob_matched_model_asks_that_routes_upstream(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    async with LocalUpstream.serve() as other:
        gw = await start_app(
            {
                "models": [
                    {"name": "first", "upstream": {"base_url": local_upstream.base_url}},
                    {
                        "name": "llama-*",
                        "upstream": {"base_url": other.base_url, "model": "served-llama"},
                        "context_window": 32_000,
                    },
                ]
            }
        )
        retrieved = await gw.openai().models.retrieve("llama-3")
        assert retrieved.id == "llama-3" and retrieved.owned_by == "fake"
        assert (retrieved.model_extra or {})["context_window"] == 32_000
        assert local_upstream.requests() == []
        [asked] = other.requests()
        assert asked["method"] == "GET" and asked["path"] == "/v1/models/served-llama"


async def test_a_model_id_cannot_climb_out_of_the_upstream_path(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        {"models": [{"name": "*", "upstream": {"base_url": local_upstream.base_url}}]}
    )
    for name in ("%2e%2e", "..%2F..%2Fadmin"):
        response = await gw.http.get(f"{gw.base_url}/models/{name}")
        assert response.status_code in (400, 404), name
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert [r["path"] for r in local_upstream.requests()] == []


# -- what is forwarded ---------------------------------------------------------------------------


async def test_the_clients_cookie_and_keys_stay_with_the_gateway_when_it_holds_the_key(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        models(
            local_upstream,
            upstream={"base_url": local_upstream.base_url, "api_key": "sk-gateway-held"},
        )
    )
    client_headers = {
        "authorization": "Bearer sk-client-own",
        "x-api-key": "sk-client-anthropic",
        "api-key": "sk-client-azure",
        "cookie": "session=browser-secret",
        "connection": "keep-alive, x-hop",
        "x-hop": "one hop only",
        "x-custom": "kept",
    }
    embeddings = await gw.http.post(
        f"{gw.base_url}/embeddings", json={"model": "m", "input": "x"}, headers=client_headers
    )
    chat = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers=client_headers,
    )
    assert embeddings.status_code == chat.status_code == 200
    for record in local_upstream.requests():
        sent = headers_of(record)
        assert sent["authorization"] == "Bearer sk-gateway-held", record["path"]
        assert sent["x-custom"] == "kept"
        for name in ("x-api-key", "api-key", "cookie", "connection", "x-hop"):
            assert name not in sent, (record["path"], name)


async def test_a_credential_in_the_configured_headers_also_replaces_the_clients(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        models(
            local_upstream,
            upstream={"base_url": local_upstream.base_url, "headers": {"X-Api-Key": "sk-held"}},
        )
    )
    response = await gw.http.post(
        f"{gw.base_url}/embeddings",
        json={"model": "m", "input": "x"},
        headers={"authorization": "Bearer sk-client-own"},
    )
    assert response.status_code == 200
    sent = headers_of(local_upstream.requests()[0])
    assert sent["x-api-key"] == "sk-held" and "authorization" not in sent


async def test_an_open_gateway_forwards_the_clients_key_but_not_its_cookie(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(models(local_upstream))
    response = await gw.http.post(
        f"{gw.base_url}/embeddings",
        json={"model": "m", "input": "x"},
        headers={"authorization": "Bearer sk-client-own", "cookie": "session=browser-secret"},
    )
    assert response.status_code == 200
    sent = headers_of(local_upstream.requests()[0])
    assert sent["authorization"] == "Bearer sk-client-own" and "cookie" not in sent


async def test_the_upstreams_date_and_server_headers_are_not_relayed(
    app_with_model: AppGateway,
) -> None:
    """In-process there is no server to add its own; over a socket the client gets uvicorn's
    (tests/test_request_log.py checks there is exactly one of each)."""
    gw = app_with_model
    embeddings = await gw.http.post(f"{gw.base_url}/embeddings", json={"model": "m", "input": "x"})
    chat = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    for response in (embeddings, chat):
        assert "date" not in response.headers and "server" not in response.headers
        assert response.headers["x-compactgate-request-id"]


@pytest.fixture
async def app_with_model(start_app: AppStarter, local_upstream: LocalUpstream) -> AppGateway:
    return await start_app(models(local_upstream))


# -- CORS ----------------------------------------------------------------------------------------

PATHS = (
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/embeddings",
    "/v1/models",
)


def preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {
        "origin": origin,
        "access-control-request-method": method,
        "access-control-request-headers": "authorization, content-type, anthropic-version",
    }


async def test_a_local_page_gets_its_preflight_answered_on_every_path(
    app_with_model: AppGateway,
) -> None:
    gw = app_with_model
    for path in PATHS:
        method = "GET" if path == "/v1/models" else "POST"
        answer = await gw.http.options(
            f"{gw.url}{path}", headers=preflight("http://localhost:5173", method)
        )
        assert answer.status_code == 200, path
        assert answer.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert method in answer.headers["access-control-allow-methods"]
        allowed = answer.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "anthropic-version" in allowed


async def test_a_local_page_can_read_the_answer_and_the_gateways_headers(
    app_with_model: AppGateway, local_upstream: LocalUpstream
) -> None:
    gw = app_with_model
    response = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"origin": "http://127.0.0.1:8000"},
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "http://127.0.0.1:8000"
    assert response.headers["access-control-expose-headers"] == "*"
    assert len(local_upstream.chat_requests()) == 1


async def test_a_page_from_another_site_is_refused_before_anything_is_sent(
    app_with_model: AppGateway, local_upstream: LocalUpstream
) -> None:
    gw = app_with_model
    evil = "https://evil.example"
    answer = await gw.http.options(f"{gw.base_url}/chat/completions", headers=preflight(evil))
    assert answer.status_code == 400
    assert "access-control-allow-origin" not in answer.headers
    for path, body in (
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        ("/v1/embeddings", {"model": "m", "input": "x"}),
    ):
        # text/plain needs no preflight: the gateway itself must refuse it
        response = await gw.http.post(
            f"{gw.url}{path}",
            content=json.dumps(body),
            headers={"origin": evil, "content-type": "text/plain"},
        )
        assert response.status_code == 403, path
        assert response.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in response.headers
    assert local_upstream.requests() == []


async def test_configured_origins_replace_the_loopback_default(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    config = models(local_upstream)
    gw = await start_app({**config, "server": {"cors_origins": ["https://app.example"]}})
    ok = await gw.http.options(f"{gw.base_url}/responses", headers=preflight("https://app.example"))
    local = await gw.http.options(
        f"{gw.base_url}/responses", headers=preflight("http://localhost:3000")
    )
    assert ok.status_code == 200 and local.status_code == 400
    anyone = await start_app({**config, "server": {"cors_origins": ["*"]}})
    answer = await anyone.http.options(
        f"{anyone.base_url}/messages", headers=preflight("https://whoever.example")
    )
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "*"


async def test_the_gateways_own_pages_are_not_cross_origin(app_with_model: AppGateway) -> None:
    gw = app_with_model
    response = await gw.http.post(
        f"{gw.base_url}/embeddings",
        json={"model": "m", "input": "x"},
        headers={"origin": gw.url},  # the /ui page, served by the gateway itself
    )
    assert response.status_code == 200


def test_an_origin_that_is_not_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"cors_origins": ["app.example.com"]}})
    assert any(p.startswith("server.cors_origins") for p in info.value.problems)
    parse_config({"server": {"cors_origins": ["https://a.example", "http://[::1]:*", "*"]}})


# -- counted and logged ------------------------------------------------------------------------


async def test_a_forwarded_request_is_counted_and_leaves_one_log_line(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        models(local_upstream, upstream={"base_url": local_upstream.base_url, "model": "real"})
    )
    response = await gw.http.post(
        f"{gw.base_url}/embeddings",
        json={"model": "m", "input": "a secret sentence"},
        headers={"x-request-id": "pass-1", "authorization": "Bearer sk-never-logged"},
    )
    assert response.headers["x-compactgate-request-id"] == "pass-1"
    [line] = [x for x in gw.logs().splitlines() if "request_id=pass-1 " in x]
    assert " api=passthrough model=m status=200 reason=- " in line
    assert "secret sentence" not in gw.logs() and "sk-never-logged" not in gw.logs()
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    assert 'compactgate_requests_total{api="passthrough",model="m",status="200"} 1.0' in metrics


async def test_a_failed_forward_is_logged_with_its_reason(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1"
    gw = await start_app(
        {
            "models": [
                {
                    "name": "down",
                    "upstream": {"base_url": closed},
                    "retry": {"max_attempts": 1},
                }
            ]
        }
    )
    response = await gw.http.post(
        f"{gw.base_url}/embeddings",
        json={"model": "down", "input": "x"},
        headers={"x-request-id": "pass-2"},
    )
    assert response.status_code == 502
    assert response.headers["x-compactgate-request-id"] == "pass-2"
    [line] = [x for x in gw.logs().splitlines() if "request_id=pass-2 " in x]
    assert " model=down status=502 reason=upstream_unreachable " in line
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    assert 'compactgate_requests_total{api="passthrough",model="down",status="502"} 1.0' in metrics


def test_a_streamed_passthrough_answer_is_relayed_as_it_arrives(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    """A legacy streamed completion (a path the gateway does not compact) reaches the client
    event by event, not read whole first (a real server: the in-process transport buffers)."""
    gw = start_gateway(
        {"models": [{"name": "m", "upstream": {"base_url": fake_upstream.base_url}}]}
    )
    chunks: list[bytes] = []
    with httpx.stream(
        "POST",
        f"{gw.base_url}/completions",
        json={"model": "m", "prompt": "count", "stream": True},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        stream = response.iter_raw()
        chunks.append(next(stream))  # arrives while the upstream holds the rest back
        fake_upstream.release()
        chunks.extend(stream)
    assert b"[DONE]" not in chunks[0]  # the first event came before the upstream had finished
    body = b"".join(chunks)
    assert body.count(b'"text_completion"') == 3 and body.endswith(b"data: [DONE]\n\n")
