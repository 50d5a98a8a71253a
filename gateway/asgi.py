"""Plain-ASGI helpers for the hot path: bounded body reads, JSON/error responses, disconnects.

The chat endpoint is a raw ASGI app (as Starlette's own middleware is), because every
microsecond on it is overhead the client pays; these helpers keep that code short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import orjson

from .deadlines import Later, later, within
from .errors import BodyTooLargeError, GatewayError, RequestTimeoutError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# How long an answer runs before its client is watched for hanging up (`DisconnectWatcher`).
WATCH_AFTER_S = 0.1


class ClientDisconnected(Exception):
    """The client went away; there is nobody to answer."""


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def read_body(
    receive: Receive, scope: Scope, limit: int, timeout: float, drain: int = 0
) -> bytes:
    """The whole request body; 413 past `limit`, 408 if the client trickles it past `timeout`.

    A body over the limit is read on and thrown away, up to `drain` bytes more, before the 413
    goes out (design D15.4): a client writes its whole body before it reads an answer, and a
    connection closed under its write is a broken pipe, not a 413 it can read. Drained whole,
    the connection stays usable; a body that does not end within `drain` (or the deadline) gets
    its 413 with `connection: close`.
    """
    declared = header(scope, b"content-length")
    length = int(declared) if declared is not None and declared.isdigit() else None
    over = f"The request body is over the limit of {limit} bytes."
    chunks: list[bytes] = []
    size = 0
    try:
        with within(timeout):
            if length is not None and length > limit:
                size = length
                drained = length <= limit + drain and await _drained(receive, length)
                raise _too_large(
                    f"The request body is {length} bytes; the limit is {limit}.", drained
                )
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnected
                chunk = message.get("body", b"")
                size += len(chunk)
                more = message.get("more_body", False)
                if size > limit:
                    raise _too_large(
                        over, not more or await _drained(receive, limit + drain - size)
                    )
                chunks.append(chunk)
                if not more:
                    break
    except TimeoutError:
        if size > limit:  # the deadline passed while the rest was drained
            raise _too_large(over, False) from None
        raise RequestTimeoutError(
            f"The request body was not received within {timeout:g} s."
        ) from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _drained(receive: Receive, bound: int) -> bool:
    """Read and drop the rest of a body, at most `bound` bytes; whether it ended."""
    dropped = 0
    while dropped <= bound:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


def _too_large(message: str, drained: bool) -> BodyTooLargeError:
    """The 413; with `connection: close` when the rest of the body is still coming."""
    return BodyTooLargeError(message, headers=None if drained else {"connection": "close"})


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    headers: Iterable[tuple[bytes, bytes]],
    content_type: bytes | None,
) -> None:
    raw = list(headers)
    if content_type is not None:
        raw.append((b"content-type", content_type))
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_json(
    send: Send, status: int, value: Any, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    await send_bytes(send, status, orjson.dumps(value), headers, b"application/json")


async def send_error(
    send: Send, error: GatewayError, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    extra = [*headers, *((k.encode(), v.encode()) for k, v in error.headers.items())]
    await send_bytes(send, error.status, error.body(), extra, b"application/json")


class DisconnectWatcher:
    """Cancels the serving task when the client disconnects (so the upstream call is dropped).

    Started only once the body has been read: from then on any `http.disconnect` means the
    client is gone. It begins to listen `WATCH_AFTER_S` after the start, on the deadlines' shared
    timer: most answers are done by then, and they are spared a task made and cancelled each; a
    client that hung up earlier is seen as soon as it begins (its `http.disconnect` waits).
    """

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self._task: asyncio.Task[None] | None = None
        self._pending: Later | None = None
        self.disconnected = False
        self.started = False  # the response head has been sent
        self._head: Iterable[tuple[bytes, bytes]] = ()  # its headers
        self.finished = False  # the last body chunk is being sent: a disconnect now is normal

    async def send(self, message: Message) -> None:
        """`send` for the handler: notes the response's start, and marks it finished before its
        last chunk."""
        if message["type"] == "http.response.start":
            self.started = True
            self._head = message.get("headers", ())
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self._send(message)

    async def end_with_error(self, event: bytes) -> None:
        """Report an error on a response whose head is already sent: a stream gets `event` (the
        error as its API's last SSE event, the only way left to tell the client), then the body
        is ended."""
        if self.finished:
            return
        if self.event_stream:
            await self.send({"type": "http.response.body", "body": event, "more_body": True})
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    @property
    def event_stream(self) -> bool:
        """The response head sent says text/event-stream (read only when an error must be told;
        most responses end without one)."""
        return any(
            k.lower() == b"content-type" and v.startswith(b"text/event-stream")
            for k, v in self._head
        )

    def start(self) -> None:
        owner = asyncio.current_task()
        self._pending = later(WATCH_AFTER_S, lambda: self._begin(owner), owner)

    def _begin(self, owner: asyncio.Task[Any] | None) -> None:
        self._pending = None
        self._task = asyncio.get_running_loop().create_task(self._watch(owner))

    async def _watch(self, owner: asyncio.Task[Any] | None) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                if self.finished:
                    return
                self.disconnected = True
                if owner is not None:
                    owner.cancel("client disconnected")
                return

    def stop(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._task is not None:
            self._task.cancel()
            self._task = None
