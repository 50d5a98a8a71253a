"""The request-head deadline (gateway/http/connections.py), on the wire, for both uvicorn protocols.

What a client would notice: a request head trickled past the deadline gets a 408 OpenAI error and
a closed connection, on the first request of a connection and on a later keep-alive one; a
connection that never sends anything is closed without a word; a head that arrives in time, in
however many pieces, is served; and a response already being written is never interrupted by
the deadline of a head trickling behind it. The real gateway process is tested in
tests/test_slow_client.py; here a small ASGI app runs in uvicorn in this process (one server per
protocol), so both protocols are covered quickly.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import uvicorn

from gateway.http import connections
from tests.conftest import free_port

DEADLINE = 0.6


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """/slow streams for 1.5 s; anything else answers at once."""
    if scope["type"] != "http":
        return
    slow = scope["path"] == "/slow"
    headers = [(b"content-type", b"text/plain")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if slow:
        for _ in range(5):
            await send({"type": "http.response.body", "body": b"tick\n", "more_body": True})
            await asyncio.sleep(0.3)
    await send({"type": "http.response.body", "body": b"done\n"})


@pytest.fixture(scope="module", params=["httptools", "h11"])
def server(request: pytest.FixtureRequest) -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http=connections.protocol(request.param, DEADLINE),
        lifespan="off",
        log_level="warning",
    )
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert uv.started
    yield port
    uv.should_exit = True
    thread.join(10)


def request(path: str = "/") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: test\r\nX-Padding: {'p' * 40}\r\n\r\n".encode()


class Client:
    """A raw connection that sends bytes on a schedule and collects everything it is sent."""

    def __init__(self, port: int, opened: list[Client]) -> None:
        opened.append(self)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.settimeout(0.02)
        self.received = b""
        self.closed_after = -1.0
        self.started = time.monotonic()

    def pump(self) -> None:
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        except OSError:
            data = b""
        if not data and self.closed_after < 0:
            self.closed_after = time.monotonic() - self.started
        self.received += data

    def send_slowly(self, data: bytes, interval: float) -> None:
        self.started = time.monotonic()
        for byte in data:
            try:
                self.sock.send(bytes([byte]))
            except OSError:
                break
            end = time.monotonic() + interval
            while time.monotonic() < end and self.closed_after < 0:
                self.pump()
            if self.closed_after >= 0:
                break

    def until_closed(self, timeout: float = 5) -> None:
        end = time.monotonic() + timeout
        while self.closed_after < 0 and time.monotonic() < end:
            self.pump()

    def responses(self) -> list[tuple[int, bytes]]:
        out, rest = [], self.received
        while rest:
            head, _, rest = rest.partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                None,
            )
            if length is None:  # chunked
                body = b""
                while True:
                    size_line, _, rest = rest.partition(b"\r\n")
                    size = int(size_line, 16)
                    body, rest = body + rest[:size], rest[size + 2 :]
                    if size == 0:
                        break
            else:
                body, rest = rest[:length], rest[length:]
            out.append((status, body))
        return out


@pytest.fixture
def connect(server: int) -> Iterator[Callable[[], Client]]:
    """connect() -> a new Client to the server; every one is closed after the test."""
    opened: list[Client] = []
    yield lambda: Client(server, opened)
    for client in opened:
        client.sock.close()


def assert_timed_out_with_408(client: Client) -> None:
    status, body = client.responses()[-1]
    assert status == 408
    error = orjson.loads(body)["error"]
    assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    assert "headers" in error["message"]
    assert DEADLINE - 0.05 <= client.closed_after < DEADLINE + 1.0, client.closed_after


def test_a_trickled_head_gets_408_and_the_connection_is_closed(
    connect: Callable[[], Client],
) -> None:
    client = connect()
    client.send_slowly(request(), interval=0.05)  # ~3.5 s for the head: far past the deadline
    client.until_closed()
    assert_timed_out_with_408(client)
    assert len(client.responses()) == 1


@pytest.mark.slow
def test_the_second_request_of_a_keep_alive_connection_has_its_own_deadline(
    connect: Callable[[], Client],
) -> None:
    client = connect()
    client.sock.sendall(request())
    time.sleep(DEADLINE + 0.3)  # the first request's deadline would have passed by now
    client.pump()
    assert client.responses() == [(200, b"done\n")]
    client.send_slowly(request(), interval=0.05)
    client.until_closed()
    assert [status for status, _ in client.responses()] == [200, 408]
    assert_timed_out_with_408(client)


def test_a_connection_that_sends_nothing_is_closed_silently(connect: Callable[[], Client]) -> None:
    client = connect()
    client.until_closed()
    assert client.received == b""
    assert DEADLINE - 0.05 <= client.closed_after < DEADLINE + 1.0


@pytest.mark.slow
def test_a_head_in_pieces_within_the_deadline_is_served(connect: Callable[[], Client]) -> None:
    client = connect()
    head = request()
    for piece in (head[:10], head[10:30], head[30:]):
        client.sock.sendall(piece)
        time.sleep(DEADLINE / 5)
    end = time.monotonic() + 3
    while not client.received.endswith(b"done\n") and time.monotonic() < end:
        client.pump()
    assert client.responses() == [(200, b"done\n")]


@pytest.mark.slow
def test_a_response_in_progress_is_finished_before_a_slow_pipelined_head_closes_it(
    connect: Callable[[], Client],
) -> None:
    client = connect()
    client.sock.sendall(request("/slow"))  # streams for 1.5 s, longer than the deadline
    time.sleep(0.1)
    client.send_slowly(request()[:20], interval=0.01)  # a pipelined head that stops half way
    client.until_closed(timeout=5)
    first, *after = client.responses()
    assert first == (200, b"tick\n" * 5 + b"done\n")
    # httptools times the pipelined head from its first byte and closes once the response is
    # done; h11 only parses it once the response is done, and answers 408 a deadline later
    assert [status for status, _ in after] in ([], [408])


@pytest.mark.slow
def test_the_deadline_counts_from_the_start_of_the_head_in_progress() -> None:
    """Heads that complete in time cost no timer each; a later head gets its own full time."""
    expired: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        begin = loop.time()
        deadline = connections.HeadDeadline(loop, 0.4, lambda: expired.append(loop.time() - begin))
        deadline.start()
        timer = deadline._timer
        for _ in range(100):  # a busy keep-alive connection: head, served, head, ...
            deadline.stop()
            deadline.start()
        assert deadline._timer is timer  # no new timer per request
        deadline.stop()
        await asyncio.sleep(0.3)
        deadline.start()  # a head that began at 0.3 s has until 0.7 s
        deadline.start()  # a later byte of it does not extend that
        await asyncio.sleep(0.2)
        assert expired == []
        await asyncio.sleep(0.4)
        deadline.start()
        deadline.close()  # the connection is gone: nothing fires any more
        await asyncio.sleep(0.5)

    asyncio.run(scenario())
    [when] = expired
    assert 0.65 <= when < 0.9


def test_the_protocol_factory_pickles_for_worker_processes() -> None:
    factory = connections.protocol("httptools", 7.5)
    copy = pickle.loads(pickle.dumps(factory))
    assert copy.func is connections.HttpToolsHeadDeadline
    assert copy.keywords == {"head_timeout": 7.5, "idle_trim": None}
    assert connections.protocol("auto", 1).func is connections.HttpToolsHeadDeadline
    assert connections.protocol("h11", 1).func is connections.H11HeadDeadline
    with pytest.raises(ValueError, match="httptools or h11"):
        connections.protocol("zttp", 1)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_closed_connection_is_freed_without_the_cycle_collector(http: str) -> None:
    """The deadline's callback must not hold its protocol: a reference cycle per connection kept
    every closed connection's objects alive until a full collection (a 500-stream burst left
    ~40,000 extra live blocks)."""
    import gc
    import weakref
    from unittest import mock

    from uvicorn.server import ServerState

    async def scenario() -> weakref.ref[asyncio.Protocol]:
        config = uvicorn.Config(app, lifespan="off")
        config.load()
        proto = connections.protocol(http, 5.0)(
            config=config, server_state=ServerState(), app_state={}
        )
        transport = mock.Mock()
        transport.get_extra_info.return_value = None
        transport.is_closing.return_value = False
        proto.connection_made(transport)
        proto.connection_lost(None)
        return weakref.ref(proto)

    gc.disable()
    try:
        assert asyncio.run(scenario())() is None
    finally:
        gc.enable()
