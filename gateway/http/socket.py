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
  before the socket opens); every request on it belongs to that tenant. A browser's upgrade
  (it carries `Origin`) is refused before the socket opens as an HTTP request from that page
  would be: an origin `server.cors_origins` does not allow, or a Host a DNS-rebinding page
  could use (`cors.Origins`, `hosts`; design D16.7).
- Requests on one socket run one after the other, in the order they came. The frames waiting
  behind the one being answered are bounded (`server.websocket_queue_bytes`, see
  `socket_frames`): past it the client gets an error frame (429 `websocket_queue_full`) and
  the socket is closed. When the client leaves, the frames still waiting are dropped: nothing
  it queued is sent upstream after it has gone (design D9.8).
- A request that fails gets one `error` frame in the shape Codex reads on this transport,
  `{"type": "error", "status": N, "error": {...}, "headers": {...}}`, and the socket stays
  usable; it carries the `sequence_number` after the last frame of its answer. Nothing is sent
  for a request after its last frame (`response.completed`, `response.failed`,
  `response.incomplete` or `error`): a stray frame would be read as the start of the next
  answer.
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
from ..errors import GatewayError, InvalidRequestError, TooManyFramesError
from ..wire.fields import serialise
from . import admin
from .auth import Authenticator
from .cors import Origins
from .socket_frames import FrameQueue, FrameRelay

log = logging.getLogger("compactgate.websocket")
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = "/v1/responses"
CREATE = "response.create"
PROCESSED = "response.processed"  # Codex's acknowledgement of an answer: nothing to send back
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
        self.overflows = Counter(
            "compactgate_websocket_queue_overflows",
            "Responses WebSockets closed because more frames waited than "
            "server.websocket_queue_bytes allows",
            registry=registry,
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


class ResponsesSocket:
    """The WebSocket endpoint: accepts the socket, then serves its frames one at a time through
    `endpoint` (the HTTP Responses endpoint, an ASGI app)."""

    def __init__(
        self,
        auth: Authenticator,
        endpoint: ASGIApp,
        server: ServerConfig,
        registry: CollectorRegistry,
        origins: Origins,
    ) -> None:
        self.auth = auth
        self.endpoint = endpoint
        self.server = server
        self.origins = origins
        self.metrics = SocketMetrics(registry)

    async def session(self, websocket: WebSocket) -> None:
        scope = websocket.scope
        refused = admin.refusal(scope, self.server, self.origins.hosts) or self.origins.refusal(
            scope
        )
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
        frames = FrameQueue(self.server.websocket_queue_bytes)
        closed = asyncio.Event()
        reader = asyncio.create_task(self._read(websocket, frames, closed))
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
            frames.close()
            self.metrics.open.dec()
            log.info("websocket closed after %d requests", served)

    async def _read(self, websocket: WebSocket, frames: FrameQueue, closed: asyncio.Event) -> None:
        """Queue every frame the client sends until it leaves: then `closed` is set and the
        frames still waiting are dropped (nothing queued goes upstream after a disconnect). Past
        the queue's bound the client gets an error frame and the socket is closed."""
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if not frames.put(text if text is not None else message.get("bytes") or b""):
                    await self._overflowed(websocket, frames)
                    break
        finally:
            closed.set()
            frames.close()

    async def _overflowed(self, websocket: WebSocket, frames: FrameQueue) -> None:
        self.metrics.overflows.inc()
        error = TooManyFramesError(
            f"More than {frames.limit} bytes of frames are waiting on this socket behind the "
            "request being answered (server.websocket_queue_bytes): send the next request after "
            "the last one's final event. The socket is closed."
        )
        log.warning("websocket closed: %s", error.message)
        body = orjson.loads(error.body())["error"]
        event = {"type": "error", "status": error.status, "error": body, "headers": {}}
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
            await websocket.send_text(orjson.dumps(event).decode())
            await websocket.close(code=1008, reason="too many frames queued")

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
        try:
            body = serialise(payload)
        except GatewayError as error:
            await relay.error(error)
            return str(error.status)
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
