"""Slow clients (design D16.3): a body trickled byte by byte is cut off by `body_read_timeout_s`, and
request headers trickled byte by byte by `header_read_timeout_s`.

What a user would notice: the trickling client gets a 408 OpenAI error once the timeout has
passed (not before, not never) and, for headers, its connection closed, also when it trickles the
second request of a keep-alive connection; nothing of its request reaches the upstream, and while
it (and a crowd like it) trickles, everybody else is served at normal speed by the same single
worker. (Both protocols and the finer cases are in tests/test_connections.py.)
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import openai
import orjson
import pytest

from tests.conftest import GatewayProcess
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process

pytestmark = pytest.mark.slow  # clients trickle for seconds by design

TIMEOUT_S = 2.0
HEAD_TIMEOUT_S = 2.0
SMALL = [{"role": "user", "content": "Say hi."}]
BODY = orjson.dumps({"model": "m", "messages": SMALL})


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    config = {
        "server": {"body_read_timeout_s": TIMEOUT_S, "header_read_timeout_s": HEAD_TIMEOUT_S},
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": fake_upstream_server.base_url},
                "context_window": 100_000,
            }
        ],
    }
    with gateway_process(config, tmp_path_factory.mktemp("slow")) as gw:
        yield gw


class Trickler(threading.Thread):
    """Sends the request head at once, then the body one byte every `interval` seconds, and
    reads whatever the gateway answers (the answer may come while it is still sending)."""

    def __init__(self, port: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.interval = interval
        self.answer = b""
        self.answered_after = -1.0
        self.started_at = time.monotonic()

    def run(self) -> None:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
            b"Content-Type: application/json\r\nAuthorization: Bearer sk-slow\r\n"
            b"Content-Length: %d\r\n\r\n" % len(BODY)
        )
        self.started_at = time.monotonic()
        self.sock.sendall(head)
        reader = threading.Thread(target=self._read, daemon=True)
        reader.start()
        try:
            for byte in BODY:
                if self.answer:
                    break
                self.sock.sendall(bytes([byte]))
                time.sleep(self.interval)
        except OSError:
            pass  # the gateway closed the connection on us: expected after its 408
        reader.join(15)
        self.sock.close()

    def _read(self) -> None:
        data = b""
        try:
            while not _complete(data):
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                if not data:
                    self.answered_after = time.monotonic() - self.started_at
                data += chunk
        except OSError:
            pass
        self.answer = data


def _complete(raw: bytes) -> bool:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def parse_response(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, orjson.loads(body)


def test_a_trickled_body_is_cut_off_with_408_and_nothing_goes_upstream(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    trickler = Trickler(gateway.port)  # ~6 s to send the whole body: well past the timeout
    trickler.start()
    trickler.join(20)
    assert trickler.answer, "the gateway never answered the slow client"
    status, body = parse_response(trickler.answer)
    assert status == 408
    error = body["error"]
    assert isinstance(error, dict) and error["code"] == "request_timeout" and error["message"]
    assert TIMEOUT_S - 0.2 <= trickler.answered_after < TIMEOUT_S + 3
    assert fake_upstream.chat_requests() == []


def served_meanwhile(
    api: openai.OpenAI, tricklers: Sequence[threading.Thread], busy: Callable[[], bool]
) -> list[float]:
    """Ordinary requests sent while `busy()` holds, then the tricklers joined: their latencies,
    which must be many and normal (the slow clients hold up nobody)."""
    latencies: list[float] = []
    while busy() and len(latencies) < 400:
        started = time.monotonic()
        assert api.chat.completions.create(model="m", messages=SMALL).choices
        latencies.append(time.monotonic() - started)
    for t in tricklers:
        t.join(20)
    assert len(latencies) >= 10
    assert statistics.median(latencies) < 0.25 and max(latencies) < 2
    return latencies


def test_other_clients_are_served_while_many_clients_trickle(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    api = openai.OpenAI(base_url=gateway.base_url, api_key="sk-normal", max_retries=0, timeout=10)
    assert api.chat.completions.create(model="m", messages=SMALL).choices  # warm (tokenizer loaded)
    tricklers = [Trickler(gateway.port, interval=0.05) for _ in range(30)]
    for t in tricklers:
        t.start()
    # normal requests keep flowing during the whole timeout window, at normal speed
    latencies = served_meanwhile(api, tricklers, lambda: any(not t.answer for t in tricklers))
    assert all(parse_response(t.answer)[0] == 408 for t in tricklers)
    assert len(fake_upstream.chat_requests()) == 1 + len(latencies)  # only the normal ones


HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
    b"Authorization: Bearer sk-slow-head\r\nContent-Length: %d\r\n\r\n" % len(BODY)
)


class HeadTrickler(threading.Thread):
    """Sends a request head one byte every `interval` seconds (after `first`, a whole request
    sent at once on the same connection), and notes when the gateway answers and closes."""

    def __init__(self, port: int, interval: float = 0.05, first: bytes = b"") -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.interval = interval
        self.first = first
        self.answer = b""
        self.closed_after = -1.0  # seconds from the first byte of the trickled head

    def run(self) -> None:
        started = time.monotonic()
        try:
            if self.first:
                self.sock.sendall(self.first)
                self.answer = _read_response(self.sock)
            self.sock.settimeout(self.interval)
            started = time.monotonic()
            for byte in HEAD:
                self.sock.sendall(bytes([byte]))
                try:
                    data = self.sock.recv(65536)
                except TimeoutError:
                    continue
                self.answer += data
                if not data:
                    break
            self.sock.settimeout(10)
            while data := self.sock.recv(65536):
                self.answer += data
        except OSError:
            pass  # reset or broken pipe once the gateway has closed: what we expect
        self.closed_after = time.monotonic() - started
        self.sock.close()


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while not _complete(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_trickled_headers_are_cut_off_while_everybody_else_is_served(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    api = openai.OpenAI(base_url=gateway.base_url, api_key="sk-normal", max_retries=0, timeout=10)
    assert api.chat.completions.create(model="m", messages=SMALL).choices  # warm
    whole = HEAD + BODY
    tricklers = [HeadTrickler(gateway.port) for _ in range(20)]
    # keep-alive: a first request served at once, then the second one's head trickled
    tricklers += [HeadTrickler(gateway.port, first=whole) for _ in range(5)]
    for t in tricklers:
        t.start()
    latencies = served_meanwhile(api, tricklers, lambda: any(t.is_alive() for t in tricklers))
    for t in tricklers:
        # ~7 s to send the whole head: cut off after the timeout instead, and closed
        assert HEAD_TIMEOUT_S - 0.2 <= t.closed_after < HEAD_TIMEOUT_S + 3, t.closed_after
        responses = t.answer.split(b"HTTP/1.1 ")[1:]
        assert len(responses) == (2 if t.first else 1)
        status, body = parse_response(b"HTTP/1.1 " + responses[-1])
        assert status == 408 and body["error"]["code"] == "request_timeout"  # type: ignore[index]
        if t.first:
            assert parse_response(b"HTTP/1.1 " + responses[0])[0] == 200
    # the normal requests and the keep-alive clients' whole first requests, nothing else
    assert len(fake_upstream.chat_requests()) == 1 + len(latencies) + 5
