"""What crosses a Responses WebSocket besides its requests: the frames a client queued behind
the answer under way, and the answer turned into frames (design D9.8).

The rules this module owns: the frames waiting are bounded (`FrameQueue`: past
`server.websocket_queue_bytes` the socket is closed, and closed it drops what waits, so
nothing queued goes upstream once the client has gone); an answer's frames are its SSE events
as the upstream wrote them, one per frame, and exactly one final frame ends each answer
(`FrameRelay`: an `error` frame carries the status Codex reads as final and the
`sequence_number` after the answer's last frame).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..asgi import Message
from ..errors import GatewayError, UpstreamError, status_of_code
from ..wire.usage import json_or_none, sse_events

TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
ENDED_EARLY = "The upstream's stream ended before `response.completed`."


class FrameQueue:
    """The frames a client sent that wait behind the request being answered: at most `limit`
    bytes of them (each counted with a little overhead, so tiny frames are bounded too), except
    that one frame may always wait whatever its size (the frame size has its own limit,
    `ws_max_size`). Closed, it drops what waits and gives None."""

    OVERHEAD = 64  # bytes a waiting frame costs beyond its text

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._frames: deque[str | bytes] = deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, frame: str | bytes) -> bool:
        """Queue `frame`; False (nothing queued) when it would pass the bound."""
        size = len(frame) + self.OVERHEAD
        if self._frames and self._bytes + size > self.limit:
            return False
        self._frames.append(frame)
        self._bytes += size
        self._ready.set()
        return True

    async def get(self) -> str | bytes | None:
        """The next frame, waiting for one; None once closed."""
        while not self._frames and not self._closed:
            self._ready.clear()
            await self._ready.wait()
        if self._closed:
            return None
        frame = self._frames.popleft()
        self._bytes -= len(frame) + self.OVERHEAD
        return frame

    def close(self) -> None:
        self._closed = True
        self._frames.clear()
        self._bytes = 0
        self._ready.set()


class FrameRelay:
    """The `send` an HTTP answer is given: it turns the answer into frames on the socket.

    A streamed 200 is cut into its events, each sent as one text frame as the upstream wrote it
    (an `error` event gets the `status` Codex needs to treat it as final); any other answer is
    one error frame. It notes what the client was told: the response id and output items (for
    `SocketHistory`) and whether the answer reached its last frame.
    """

    def __init__(self, websocket: WebSocket, exchange_frames: bool) -> None:
        self.websocket = websocket
        self.exchange_frames = exchange_frames
        self.status = 0
        self.headers: dict[str, str] = {}
        self.streamed = False
        self.ended = False  # the answer's last frame has been sent
        self.gone = False  # the client has closed the socket
        self.response_id: str | None = None
        self.output: list[Any] = []
        self._pending = b""
        self._body: list[bytes] = []
        self._sequence: int | None = None  # the highest sequence_number relayed

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            raw = message.get("headers", ())
            self.headers = {
                k.decode("latin-1").lower(): v.decode("latin-1")
                for k, v in raw
                if k.lower().startswith(b"x-compactgate-") or k.lower() == b"retry-after"
            }
            self.streamed = self.status == 200 and any(
                k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in raw
            )
            if self.streamed and self.exchange_frames:
                await self.send_event({"type": "compactgate.exchange", "headers": self.headers})
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            if self.streamed:
                await self._feed(chunk)
            else:
                self._body.append(chunk)

    async def finish(self) -> None:
        """After the answer: an error frame for an answer that was not a stream, or a stream
        that stopped before its last event."""
        if self.ended:
            return
        if self.streamed:
            await self._feed(b"\n\n")  # an unterminated last event
        if self.ended or self.status == 0:  # nothing was answered (the client left)
            return
        if self.streamed or 200 <= self.status < 300:
            await self.error(UpstreamError(ENDED_EARLY))
            return
        document = json_or_none(b"".join(self._body))
        error = document.get("error") if isinstance(document, dict) else None
        if isinstance(error, Mapping):
            await self._error_frame(self.status, dict(error))
        else:  # not an OpenAI error body: its text is the message
            text = b"".join(self._body).decode("utf-8", "replace")[:2000]
            await self._error_frame(self.status, {"type": "upstream_error", "message": text})

    async def error(self, error: GatewayError) -> None:
        body = orjson.loads(error.body())["error"]
        self.headers.update(error.headers)
        await self._error_frame(error.status, body)

    async def _error_frame(
        self, status: int, error: dict[str, Any], sequence: int | None = None
    ) -> None:
        """The answer's final error frame, numbered after the frames relayed before it."""
        if sequence is None:
            sequence = 0 if self._sequence is None else self._sequence + 1
        event = {
            "type": "error",
            "status": status,
            "error": error,
            "headers": self.headers,
            "sequence_number": sequence,
        }
        await self.send_event(event)
        self.ended = True

    async def _feed(self, chunk: bytes) -> None:
        data = (self._pending + chunk).replace(b"\r\n", b"\n")
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return
        complete, self._pending = data[: end + 2], data[end + 2 :]
        for _, event in sse_events(complete):
            if self.ended:
                return
            await self._relay(event)

    async def _relay(self, data: bytes) -> None:
        document = json_or_none(data)
        kind = document.get("type") if isinstance(document, dict) else None
        if kind is None:
            return  # not an event of this API (a `[DONE]`, a comment)
        number = document.get("sequence_number")
        if isinstance(number, int) and not isinstance(number, bool):
            self._sequence = number if self._sequence is None else max(self._sequence, number)
        if kind == "error":  # final on this transport only with a status
            status, error = _stream_error(document)
            await self._error_frame(status, error, number if isinstance(number, int) else None)
            return
        if kind == "response.output_item.done" and "item" in document:
            self.output.append(document["item"])
        elif kind == "response.completed":
            response = document.get("response")
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                self.response_id = response["id"]
        await self._send_text(data.decode("utf-8", "replace"))
        if kind in TERMINAL:
            self.ended = True

    async def send_event(self, event: Mapping[str, Any]) -> None:
        await self._send_text(orjson.dumps(event).decode())

    async def _send_text(self, text: str) -> None:
        """A frame to the client; once the client has gone, nothing (as an HTTP response's
        body is dropped after a disconnect: the endpoint notices and cancels the upstream)."""
        if self.gone:
            return
        try:
            await self.websocket.send_text(text)
        except (WebSocketDisconnect, OSError, RuntimeError):
            self.gone = True


def _stream_error(event: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """An SSE `error` event as this transport's final error: a status, and the error object.

    The flat form (`code`, `message`, `param` beside `type`: OpenAI's, and the gateway's own)
    and the nested one (`error: {...}`) are both read; the status is the event's own, else the
    one the error table gives the code, else 502.
    """
    nested = event.get("error")
    if isinstance(nested, Mapping):
        error = dict(nested)
    else:
        error = {k: v for k, v in event.items() if k not in ("type", "sequence_number", "status")}
    error.setdefault("type", "upstream_error")
    status = event.get("status")
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status < 600:
        status = status_of_code(error.get("code"))
    return status, error
