"""The Responses API over a WebSocket (`GET /v1/responses`, upgraded), as Codex CLI speaks it.

A Codex model provider with `supports_websockets = true` opens one socket per session and sends
each request as a JSON text frame `{"type": "response.create", ...the Responses body...}`; the
server answers with the events an SSE stream would carry, one JSON text frame each, and the
socket stays open for the next request. The rules this module keeps:

- Each `response.create` takes the HTTP request path unchanged: it is handed, as a POST
  /v1/responses with the upgrade request's headers, to the same `Endpoint` that serves HTTP
  (authentication, parsing, compaction, reactive retry, metrics, event log, agent compaction
  answers), and the SSE answer is cut into frames. Nothing here compacts or retries.
- The socket is authenticated once, at the upgrade, exactly as an HTTP request (401 and 403
  before the socket opens); every request on it belongs to that tenant.
- Requests on one socket run one after the other, in the order they came.
- A request that fails gets one `error` frame in the shape Codex reads on this transport,
  `{"type": "error", "status": N, "error": {...}, "headers": {...}}`, and the socket stays
  usable. Nothing is sent for a request after its last frame (`response.completed`,
  `response.failed`, `response.incomplete` or `error`): a stray frame would be read as the
  start of the next answer.
- Codex sends a follow-up as `previous_response_id` plus only the new input items, expecting
  the server to remember the last response of the socket (it sends `store: false`, so no
  upstream holds it). The socket remembers the last request's full input and the items its
  answer produced, and forwards the whole conversation, which the gateway can then compact. A
  `previous_response_id` it did not issue is forwarded unchanged (the upstream may hold it).
- `generate: false` (Codex warming the connection up) is answered here with an empty completed
  response and no upstream call: an upstream over HTTP would generate a whole answer for it.
- The `x-compactgate-*` headers of an answer travel in the `headers` of an error frame; for
  answers that succeed, a client that asked for them at the upgrade (`x-compactgate-exchange:
  on`) gets one `compactgate.exchange` frame with them before the answer's first event. Other
  clients get no frame they did not ask for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..asgi import Message, Receive, Scope, Send, header
from ..config import ServerConfig
from ..errors import GatewayError, InvalidRequestError, UpstreamError, status_of_code
from ..wire.usage import json_or_none, sse_events
from . import admin
from .auth import Authenticator

log = logging.getLogger("compactgate.websocket")
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = "/v1/responses"
CREATE = "response.create"
PROCESSED = "response.processed"  # Codex's acknowledgement of an answer: nothing to send back
TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
EXCHANGE_HEADER = b"x-compactgate-exchange"
# The upgrade's own headers, and the request id (each request on the socket gets its own).
NOT_FORWARDED = frozenset(
    {
        b"connection",
        b"upgrade",
        b"content-length",
        b"content-type",
        b"x-request-id",
        EXCHANGE_HEADER,
    }
)
SOCKET_BETA = b"responses_websockets="  # Codex's `openai-beta` flag for this transport
ENDED_EARLY = "The upstream's stream ended before `response.completed`."


class SocketMetrics:
    """What only this transport has: sockets, and requests per outcome (the requests
    themselves are counted with every other Responses request, api="responses")."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections = Counter(
            "compactgate_websocket_connections",
            "Responses WebSocket connections accepted",
            registry=registry,
        )
        self.open = Gauge(
            "compactgate_websocket_connections_open",
            "Responses WebSocket connections open now",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.requests = Counter(
            "compactgate_websocket_requests",
            "Frames that asked for an answer on a Responses WebSocket, by HTTP-equivalent status "
            "(prewarm: `generate: false`, answered without an upstream call)",
            ["status"],
            registry=registry,
        )


@dataclass(slots=True)
class SocketHistory:
    """The last answer of one socket, as the client will refer to it with `previous_response_id`:
    the full input of its request and the output items the client was sent."""

    response_id: str | None = None
    input: list[Any] = field(default_factory=list)
    output: list[Any] = field(default_factory=list)

    def expand(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`payload` with the whole conversation as `input` when it continues the last answer
        of this socket; unchanged otherwise (another `previous_response_id` is the upstream's)."""
        previous = payload.get("previous_response_id")
        if previous is None or previous != self.response_id:
            return payload
        expanded = {k: v for k, v in payload.items() if k != "previous_response_id"}
        expanded["input"] = [*self.input, *self.output, *_items(payload.get("input", []))]
        return expanded

    def remember(self, payload: Mapping[str, Any], response_id: str, output: list[Any]) -> None:
        self.response_id = response_id
        self.input = _items(payload.get("input", []))
        self.output = output


def _items(value: Any) -> list[Any]:
    """A Responses `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


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

    async def _error_frame(self, status: int, error: dict[str, Any]) -> None:
        event = {"type": "error", "status": status, "error": error, "headers": self.headers}
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
        if kind == "error":  # final on this transport only with a status
            await self._error_frame(*_stream_error(document))
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


class ResponsesSocket:
    """The WebSocket endpoint: accepts the socket, then serves its frames one at a time through
    `endpoint` (the HTTP Responses endpoint, an ASGI app)."""

    def __init__(
        self,
        auth: Authenticator,
        endpoint: ASGIApp,
        server: ServerConfig,
        registry: CollectorRegistry,
    ) -> None:
        self.auth = auth
        self.endpoint = endpoint
        self.server = server
        self.metrics = SocketMetrics(registry)

    async def session(self, websocket: WebSocket) -> None:
        scope = websocket.scope
        refused = admin.refusal(scope, self.server)
        try:
            if refused is not None:
                raise refused
            self.auth.authenticate(scope)  # the tenant of every request on this socket
        except GatewayError as error:
            await _deny(websocket, error)
            return
        await websocket.accept()
        self.metrics.connections.inc()
        self.metrics.open.inc()
        frames: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        closed = asyncio.Event()
        reader = asyncio.create_task(_read(websocket, frames, closed))
        history = SocketHistory()
        exchange_frames = (header(scope, EXCHANGE_HEADER) or b"").lower() in (b"on", b"1")
        served = 0
        try:
            while (frame := await frames.get()) is not None:
                relay = FrameRelay(websocket, exchange_frames)
                status = await self.serve(scope, frame, history, relay, closed)
                if status is not None:
                    served += 1
                    self.metrics.requests.labels(status).inc()
        except (WebSocketDisconnect, OSError):
            pass  # the client left mid-answer: the endpoint has already dropped the upstream
        finally:
            reader.cancel()
            self.metrics.open.dec()
            log.info("websocket closed after %d requests", served)

    async def serve(
        self,
        scope: Scope,
        frame: str | bytes,
        history: SocketHistory,
        relay: FrameRelay,
        closed: asyncio.Event,
    ) -> str | None:
        """One frame; the status label of its answer, or None when it asked for none."""
        try:
            payload = _request(frame)
        except GatewayError as error:
            await relay.error(error)
            return str(error.status)
        if payload is None:
            return None
        generate = payload.pop("generate", True)
        payload = history.expand(payload)
        if generate is False:
            response_id = await _prewarmed(relay, payload)
            history.remember(payload, response_id, [])
            return "prewarm"
        payload["stream"] = True  # this transport only streams
        body = orjson.dumps(payload)
        await self.endpoint(_http_scope(scope, len(body)), _receive(body, closed), relay)
        if closed.is_set():
            return "499"  # the client left: nobody to tell
        await relay.finish()
        if relay.response_id is not None and relay.status == 200:
            history.remember(payload, relay.response_id, relay.output)
        return str(relay.status) if relay.status else "499"


def _request(frame: str | bytes) -> dict[str, Any] | None:
    """The Responses body a frame asks for; None for a frame that asks for no answer."""
    if isinstance(frame, bytes):
        raise InvalidRequestError("Send requests as JSON text frames, not binary ones.")
    try:
        payload = orjson.loads(frame)
    except orjson.JSONDecodeError as error:
        raise InvalidRequestError(f"The frame is not valid JSON: {error}.") from None
    if not isinstance(payload, dict):
        raise InvalidRequestError("A frame must be a JSON object with a `type`.", param="type")
    kind = payload.pop("type", None)
    if kind == PROCESSED:
        return None
    if kind != CREATE:
        raise InvalidRequestError(
            f"Unsupported frame type {kind!r}: this socket takes `{CREATE}`.", param="type"
        )
    return payload


async def _prewarmed(relay: FrameRelay, payload: Mapping[str, Any]) -> str:
    """`generate: false`: a completed response with no output, as the warm-up expects."""
    response_id = "resp_" + uuid.uuid4().hex
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": payload.get("model"),
        "output": [],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
    }
    in_progress = {**response, "status": "in_progress"}
    await relay.send_event(
        {"type": "response.created", "sequence_number": 0, "response": in_progress}
    )
    await relay.send_event(
        {"type": "response.completed", "sequence_number": 1, "response": response}
    )
    relay.ended = True
    return response_id


def _http_scope(scope: Scope, length: int) -> Scope:
    """The HTTP request a frame stands for: POST /v1/responses with the upgrade's headers, less
    those that only concern the upgrade (the caller is already authenticated: the identity
    rides along)."""
    headers = []
    for name, value in scope["headers"]:
        lower = name.lower()
        if lower in NOT_FORWARDED or lower.startswith(b"sec-websocket-"):
            continue
        if lower == b"openai-beta":  # the socket's own beta flag means nothing over HTTP
            kept = [f for f in value.split(b",") if not f.strip().startswith(SOCKET_BETA)]
            if not kept:
                continue
            value = b",".join(kept).strip()
        headers.append((name, value))
    headers += [(b"content-type", b"application/json"), (b"content-length", str(length).encode())]
    http = {k: v for k, v in scope.items() if k not in ("type", "subprotocols", "headers")}
    http.update(
        type="http",
        method="POST",
        scheme="https" if scope.get("scheme") == "wss" else "http",
        path=PATH,
        raw_path=PATH.encode(),
        http_version="1.1",
        headers=headers,
    )
    return http


def _receive(body: bytes, closed: asyncio.Event) -> Receive:
    """`receive` for the HTTP request: its body, then a disconnect once the socket closes."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await closed.wait()
        return {"type": "http.disconnect"}

    return receive


async def _read(
    websocket: WebSocket, frames: asyncio.Queue[str | bytes | None], closed: asyncio.Event
) -> None:
    """Queue every frame the client sends until it leaves (then None, and `closed` is set)."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            text = message.get("text")
            frames.put_nowait(text if text is not None else message.get("bytes") or b"")
    finally:
        closed.set()
        frames.put_nowait(None)


async def _deny(websocket: WebSocket, error: GatewayError) -> None:
    """Refuse the upgrade with the HTTP answer the same request would get, where the server
    can send one; otherwise close the handshake (uvicorn then answers 403)."""
    response = Response(
        error.body(), status_code=error.status, media_type="application/json", headers=error.headers
    )
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:
        with contextlib.suppress(RuntimeError):
            await websocket.close(code=1008, reason=error.message[:120])
