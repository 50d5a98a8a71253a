"""A WebSocket client for an ASGI app in the test's event loop (the in-process layer's sockets).

httpx's `ASGITransport` speaks HTTP only; this speaks the ASGI WebSocket protocol to the app as
uvicorn would: `websocket.connect`, then the client's frames, then `websocket.disconnect`; the
app's `websocket.accept`, `websocket.send`, `websocket.close`, or a denial response
(`websocket.http.response.*`, the extension uvicorn offers).

    async with AppSocket.open(app, headers={"authorization": "Bearer k"}) as socket:
        assert socket.accepted
        await socket.send_json({"type": "response.create", ...})
        frames = await socket.until_final()

A socket the app refused has `accepted` False and `denial` (status, body) or `close_code`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

FINALS = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})


class SocketClosed(Exception):
    """The app closed the socket (or ended its session)."""


class AppSocket:
    def __init__(self) -> None:
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.accepted = False
        self.denial: tuple[int, bytes] | None = None
        self.close_code: int | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        app: Any,
        path: str = "/v1/responses",
        headers: Mapping[str, str] | None = None,
        client: tuple[str, int] = ("127.0.0.1", 50000),
        host: str = "127.0.0.1:8080",
    ) -> AsyncIterator[AppSocket]:
        """A socket on `app` (`headers` of the upgrade; `host` its Host header)."""
        socket = cls()
        raw = [(b"host", host.encode())] if host else []
        raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        scope = {
            "type": "websocket",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "scheme": "ws",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": raw,
            "client": client,
            "server": ("127.0.0.1", 8080),
            "subprotocols": [],
            "extensions": {"websocket.http.response": {}},
            "state": {},
        }
        socket._task = asyncio.create_task(app(scope, socket._receive, socket._send))
        await socket._to_app.put({"type": "websocket.connect"})
        await socket._handshake()
        try:
            yield socket
        finally:
            await socket.close()

    async def _receive(self) -> dict[str, Any]:
        return await self._to_app.get()

    async def _send(self, message: dict[str, Any]) -> None:
        await self._from_app.put(message)

    async def _next(self, timeout: float) -> dict[str, Any]:
        assert self._task is not None
        getter = asyncio.ensure_future(self._from_app.get())
        done, _ = await asyncio.wait(
            {getter, self._task}, timeout=timeout, return_when="FIRST_COMPLETED"
        )
        if getter in done:
            return getter.result()
        getter.cancel()
        if self._task in done:
            self._task.result()  # raises what the app raised
            raise SocketClosed("the app ended the session")
        raise TimeoutError(f"no message from the app within {timeout} s")

    async def _handshake(self) -> None:
        message = await self._next(30)
        if message["type"] == "websocket.accept":
            self.accepted = True
        elif message["type"] == "websocket.http.response.start":
            body = b""
            while True:
                part = await self._next(30)
                body += part.get("body", b"")
                if not part.get("more_body", False):
                    break
            self.denial = (message["status"], body)
        elif message["type"] == "websocket.close":
            self.close_code = message.get("code", 1000)

    async def send_text(self, text: str) -> None:
        await self._to_app.put({"type": "websocket.receive", "text": text})

    async def send_bytes(self, data: bytes) -> None:
        await self._to_app.put({"type": "websocket.receive", "bytes": data})

    async def send_json(self, value: Any) -> None:
        await self.send_text(orjson.dumps(value).decode())

    async def receive(self, timeout: float = 30) -> dict[str, Any]:
        """The next frame, parsed; SocketClosed once the app closed the socket."""
        message = await self._next(timeout)
        if message["type"] == "websocket.close":
            self.close_code = message.get("code", 1000)
            raise SocketClosed(f"closed with {self.close_code}")
        text = message.get("text")
        return orjson.loads(text if text is not None else message.get("bytes", b""))

    async def until_final(self, timeout: float = 30) -> list[dict[str, Any]]:
        """The frames of one answer, to its last (`response.completed`, `error`, ...)."""
        frames = []
        while True:
            frame = await self.receive(timeout)
            frames.append(frame)
            if frame.get("type") in FINALS:
                return frames

    async def close(self, code: int = 1000) -> None:
        """The client leaves; the app's session is given a moment to end."""
        if self._task is None or self._task.done():
            return
        await self._to_app.put({"type": "websocket.disconnect", "code": code})
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
