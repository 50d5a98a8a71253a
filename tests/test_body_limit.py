"""A body over `server.max_body_bytes` is answered 413 so that the client reads it (design D15.4).

A client writes its whole request body before it reads the answer. If the gateway answered and
closed the connection with the body still coming, the client's write would fail (a broken pipe,
or a reset that loses the answer too): the SDKs would see a connection error and send the whole
body again. The gateway reads the rest of the body and drops it (up to `max_drain_bytes`), then
answers; a body longer than that gets its 413 with `connection: close`.

Against a real `compactgate serve`, with a 1 MB limit and 3 MB bodies: httpx and the openai SDK
(whose transport, httpcore, reports a failed body write through its trace hook even though it
then reads the answer anyway), and a plain socket that writes everything and then reads, as most
clients do; each 20 times, with the connection kept alive and with `Connection: close` (which
makes the server close right after its answer: the case that broke writes).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.asgi import read_body
from gateway.errors import BodyTooLargeError
from tests.conftest import GatewayProcess
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process

LIMIT = 1024 * 1024
DRAIN = 4 * 1024 * 1024
TRIES = 20
CONTENT = "y" * (3 * 1024 * 1024)
BODY = b'{"model":"m","messages":[{"role":"user","content":"' + CONTENT.encode() + b'"}]}'


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    config = {
        "server": {"max_body_bytes": LIMIT, "max_drain_bytes": DRAIN},
        "models": [{"name": "m", "upstream": {"base_url": fake_upstream_server.base_url}}],
    }
    with gateway_process(config, tmp_path_factory.mktemp("body")) as gw:
        yield gw


class Traced(httpx.HTTPTransport):
    """httpx's transport, noting every failed body write httpcore reports (`failures`)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        def trace(name: str, info: dict[str, Any]) -> None:
            if name.endswith(".failed"):
                self.failures.append(f"{name}: {info.get('exception')!r}")

        request.extensions["trace"] = trace
        return super().handle_request(request)


def chunked() -> Iterator[bytes]:
    for start in range(0, len(BODY), 64 * 1024):
        yield BODY[start : start + 64 * 1024]


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
@pytest.mark.parametrize("sized", [True, False], ids=["content-length", "chunked"])
def test_httpx_reads_the_413_every_time(gateway: GatewayProcess, close: bool, sized: bool) -> None:
    transport = Traced()
    statuses = []
    headers = {"content-type": "application/json", **({"connection": "close"} if close else {})}
    with httpx.Client(transport=transport, timeout=30) as client:
        for _ in range(TRIES):
            response = client.post(
                f"{gateway.base_url}/chat/completions",
                content=BODY if sized else chunked(),
                headers=headers,
            )
            statuses.append(response.status_code)
            assert response.json()["error"]["code"] == "request_too_large"
    assert statuses == [413] * TRIES
    assert transport.failures == []  # no write was cut off


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
def test_the_openai_sdk_reads_the_413_every_time(gateway: GatewayProcess, close: bool) -> None:
    transport = Traced()
    read = 0
    with openai.OpenAI(
        base_url=gateway.base_url,
        api_key="sk-any",
        max_retries=0,
        http_client=httpx.Client(transport=transport, timeout=30),
        default_headers={"connection": "close"} if close else None,
    ) as client:
        for _ in range(TRIES):
            with pytest.raises(openai.APIStatusError) as raised:
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": CONTENT}]
                )
            assert raised.value.status_code == 413
            assert "limit" in raised.value.message
            read += 1
    assert read == TRIES
    assert transport.failures == []


def post_raw(port: int, head: bytes, body: bytes) -> bytes:
    """Write the request whole, as most clients do, then read the answer to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                break
        return answer


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
@pytest.mark.parametrize("sized", [True, False], ids=["content-length", "chunked"])
def test_a_client_that_writes_everything_first_reads_the_413(
    gateway: GatewayProcess, close: bool, sized: bool
) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += b"Content-Type: application/json\r\n" + (b"Connection: close\r\n" if close else b"")
    if sized:
        head += b"Content-Length: %d\r\n\r\n" % len(BODY)
        body = BODY
    else:
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunked()) + b"0\r\n\r\n"
    answers = [post_raw(gateway.port, head, body) for _ in range(TRIES)]  # raises on a reset
    assert all(a.startswith(b"HTTP/1.1 413 ") for a in answers), answers[0][:300]
    assert all(b'"request_too_large"' in a for a in answers)
    if not close:  # drained whole: the connection could have served another request
        assert all(b"connection: close" not in a.lower() for a in answers)


def test_a_drained_connection_serves_the_next_request(gateway: GatewayProcess) -> None:
    small = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        for body, status in ((BODY, b"413"), (small, b"200")):
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            )
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 " + status), answer[:300]


def test_a_body_longer_than_the_drain_is_refused_at_once_and_the_connection_closed(
    gateway: GatewayProcess,
) -> None:
    """Declared far beyond what the gateway would read: the 413 comes before any of the body is
    sent, says the connection closes, and the gateway closes it."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (LIMIT + DRAIN + 1)
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in answer.lower()


# -- read_body on its own -------------------------------------------------------------------


def receiver(chunks: list[bytes], then_wait: bool = False) -> Any:
    """An ASGI `receive` giving `chunks` as one body (more_body on all but the last), or, with
    `then_wait`, waiting forever after them, as a client that stopped sending."""
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        if not pending:
            await asyncio.Event().wait()
        chunk = pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending) or then_wait}

    return receive


async def test_a_body_that_stops_coming_while_drained_is_a_413_that_closes() -> None:
    """The deadline passes while the rest is dropped: still a 413 (what the client did wrong
    first), never a 408, and the connection is closed."""
    with pytest.raises(BodyTooLargeError) as raised:
        await read_body(
            receiver([b"x" * 10, b"y" * 10], then_wait=True), {"headers": []}, 15, 0.2, 100
        )
    assert raised.value.headers == {"connection": "close"}


async def test_a_drained_body_keeps_the_connection_and_a_longer_one_closes_it() -> None:
    chunks = [b"x" * 10] * 5
    with pytest.raises(BodyTooLargeError) as drained:
        await read_body(receiver(chunks), {"headers": []}, 15, 5, 100)
    assert drained.value.headers == {}
    with pytest.raises(BodyTooLargeError) as cut:
        await read_body(receiver(chunks), {"headers": []}, 15, 5, 10)
    assert cut.value.headers == {"connection": "close"}
