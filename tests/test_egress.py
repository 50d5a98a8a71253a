"""What leaves the gateway (design D11.5): only configured upstream URLs, without hop-by-hop headers.

What an operator would notice: no client-controlled value chooses where the gateway connects.
Model names only select configured routes; a passthrough path is appended to the route's
configured base_url and can never climb out of it (`..`, `%2e%2e`, `%2f`-smuggled dots) or name
another host; and headers meant for one hop (`Connection` and what it lists, `Keep-Alive`, `TE`,
`Proxy-Authorization`, ...) are not forwarded. The fake upstream's control API lives next to its
`/v1` on the same host, so a path that escaped would visibly reach it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from tests.conftest import GatewayProcess
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    upstream = {"base_url": fake_upstream_server.base_url}
    config = {"models": [{"name": "m", "upstream": upstream, "context_window": 100_000}]}
    with gateway_process(config, tmp_path_factory.mktemp("egress")) as gw:
        yield gw


def raw_request(gw: GatewayProcess, request_line: bytes, headers: bytes = b"") -> tuple[int, bytes]:
    """Send a request line exactly as given (an HTTP library would normalise the path)."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(
            request_line + b"\r\nHost: gateway\r\nConnection: close\r\n" + headers + b"\r\n"
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(
    "path",
    [
        b"/v1/../_fake/reset",
        b"/v1/files/../../_fake/reset",
        b"/v1/files/%2e%2e/%2E%2E/_fake/reset",
        b"/v1/files/.%2e/.%2e/_fake/reset",
        b"/v1/files/..%2f..%2f_fake%2freset",
        b"/v1/files/%2e%2e%5c%2e%2e%5c_fake/reset",
        b"/v1/./files",
        b"/v1/files/%00",
    ],
)
def test_a_passthrough_path_cannot_leave_the_base_url(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, path: bytes
) -> None:
    fake_upstream.script([{"kind": "ok", "content": "still scripted"}])  # a reset would drop it
    status, body = raw_request(gateway, b"POST " + path + b" HTTP/1.1", b"Content-Length: 0\r\n")
    assert status in (400, 404), body
    assert orjson.loads(body)["error"]["message"]
    assert fake_upstream.requests() == []  # nothing went anywhere
    client = openai.OpenAI(base_url=gateway.base_url, api_key="sk-x", max_retries=0, timeout=10)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "still scripted"  # the control API was not reached


@pytest.mark.parametrize(
    ("path", "forwarded"),
    [
        (b"/v1//evil.example/x", "/v1//evil.example/x"),
        (b"/v1/http://evil.example/x", "/v1/http://evil.example/x"),
        (b"/v1/files/a%2Fb", "/v1/files/a%2Fb"),
        (b"/v1/files/@evil.example", "/v1/files/@evil.example"),
        (b"/v1/files/...", "/v1/files/..."),
    ],
)
def test_odd_but_harmless_paths_stay_on_the_configured_host(
    gateway: GatewayProcess, fake_upstream: FakeUpstream, path: bytes, forwarded: str
) -> None:
    status, body = raw_request(gateway, b"GET " + path + b" HTTP/1.1")
    assert status == 200, body
    [recorded] = fake_upstream.requests()  # the request reached the configured upstream ...
    reported = orjson.loads(body)["path"]  # ... with the path under its base_url
    assert reported == recorded["path"]
    assert reported.startswith("/v1/") and reported.replace("%2F", "/") == forwarded.replace(
        "%2F", "/"
    )


def test_a_model_name_only_selects_configured_routes(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="sk-x", max_retries=0, timeout=10)
    for model in ("http://evil.example/v1", "../m", "m/../../x", "//evil.example"):
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    assert fake_upstream.requests() == []


def test_hop_by_hop_headers_are_not_forwarded(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    headers = {
        "connection": "keep-alive, x-hop-secret",
        "x-hop-secret": "for the first hop only",
        "keep-alive": "timeout=5",
        "te": "trailers",
        "proxy-authorization": "Basic c2VjcmV0",
        "upgrade": "h2c",
        "x-end-to-end": "kept",
        "authorization": "Bearer sk-client",
    }
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{gateway.base_url}/chat/completions", json=body, headers=headers)
    assert response.status_code == 200
    [recorded] = fake_upstream.chat_requests()
    sent = {k.lower(): v for k, v in recorded["headers"]}
    for name in ("x-hop-secret", "keep-alive", "te", "proxy-authorization", "upgrade"):
        assert name not in sent, name
    assert sent["x-end-to-end"] == "kept"
    assert sent["authorization"] == "Bearer sk-client"  # end to end: passed through
