"""Any other /v1/* path (files, batches, embeddings, ...), forwarded to an upstream as it came.

These requests are not the gateway's to compact or to repeat: the body goes as sent (only a
renamed model's `model` gets its upstream name), each upstream is tried once, and an event
stream is relayed as it arrives. Kept apart from `endpoints`, whose subject is the compacting
path.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..asgi import ClientDisconnected, read_body
from ..config import ServerConfig
from ..errors import NotFoundError, upstream_reason
from ..ops.metrics import Metrics
from ..path.exchange import Exchange
from ..routing import Route, Router
from ..upstream import UpstreamResponse, passthrough_path
from ..upstream.destinations import destinations
from ..upstream.retry import Sender
from ..wire import CHAT, MESSAGES
from ..wire.fields import serialise
from .auth import Authenticator
from .limits import ConcurrencyLimits


async def read_limited(server: ServerConfig, request: Request) -> bytes | None:
    """The body under the size and time limits (413/408 raised); None if the client left."""
    try:
        return await read_body(
            request.receive,
            request.scope,
            server.max_body_bytes,
            server.body_read_timeout_s,
            server.max_drain_bytes,
        )
    except ClientDisconnected:
        return None


class Passthrough:
    """Any other /v1/* path, forwarded to the upstream of the body's `model` (else the first
    configured one). The body goes as it came, except that a renamed model's `model` gets its
    upstream name, as on the compacting paths."""

    def __init__(
        self,
        auth: Authenticator,
        router: Router,
        limits: ConcurrencyLimits,
        sender: Sender,
        metrics: Metrics,
        server: ServerConfig,
    ) -> None:
        self.auth = auth
        self.router = router
        self._limits = limits
        self._sender = sender
        self._metrics = metrics
        self._server = server

    async def __call__(self, request: Request, exchange: Exchange) -> Response:
        identity = self.auth.authenticate(request.scope)
        exchange.tenant = identity.tenant
        body = await read_limited(self._server, request)
        if body is None:
            exchange.reason = "client_disconnected"
            return Response(status_code=499)
        fields = json_object(body)
        model = fields.get("model") if fields is not None else None
        if isinstance(model, str):
            exchange.requested = model
        exchange.stream = fields is not None and fields.get("stream") is True
        route = self.route_for(model if isinstance(model, str) else None)
        self.auth.authorize(identity, route.name)
        exchange.model = self._metrics.model_label(route.name)
        if route.upstream.base_url is None:
            raise NotFoundError(f"The model `{route.name}` has no OpenAI-compatible upstream.")
        if fields is not None and model == route.name and route.renamed:
            body = serialise({**fields, "model": route.upstream_model})
        # The path only extends the configured base_url: no `..`, no other host (no SSRF).
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        path = passthrough_path(raw_path)
        if request.url.query:
            path += "?" + request.url.query
        answer = await self.forward(request, exchange, route, path, body or None, stream=True)
        return answer if isinstance(answer, StreamingResponse) else answer.response()

    async def forward(
        self,
        request: Request,
        exchange: Exchange,
        route: Route,
        path: str,
        body: bytes | None,
        stream: bool = False,
    ) -> Forwarded | StreamingResponse:
        """Send the client's request to `path` under the model's upstream, with the headers
        forwarding allows (a gateway-held key goes the way the client's API wants it:
        Anthropic's when it sent `anthropic-version`). Failed over like the compacting paths,
        but each upstream is tried once: these requests (files, batches, ...) are not ours to
        repeat. With `stream`, an answer that is an event stream is relayed as it arrives (the
        tenant's slot held until it ends) instead of being read whole."""
        wire = MESSAGES if "anthropic-version" in request.headers else CHAT
        targets = destinations(route, wire, request.scope["headers"], path=path)
        started = time.perf_counter()
        with contextlib.ExitStack() as held:
            held.enter_context(self._limits.hold(exchange.tenant))
            try:
                response, _ = await self._sender.send(
                    route, targets, body, method=request.method, retry=False
                )
                if stream and response.status < 400 and "event-stream" in response.content_type:
                    return _relayed_stream(response, held.pop_all())
                try:
                    data = await response.read()
                finally:
                    response.release()
            finally:
                exchange.upstream_seconds += time.perf_counter() - started
        if response.status >= 400:
            exchange.reason = upstream_reason(response.status)
        return Forwarded(response.status, data, response.relay_headers())

    def route_for(self, model: str | None) -> Route:
        if model is not None:
            route = self.router.resolve(model)
            if route is not None and route.upstream.base_url:
                return route
        for route in self.router.routes():
            if route.upstream.base_url:
                return route
        route = self.router.resolve(model if model is not None else "default")
        if route is None:
            raise NotFoundError("No upstream is configured for this path.")
        return route


@dataclass(frozen=True, slots=True)
class Forwarded:
    """An upstream's whole answer to a forwarded request."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]

    def response(self) -> Response:
        response = Response(self.body, status_code=self.status)
        response.raw_headers.extend(self.headers)
        return response


def _relayed_stream(response: UpstreamResponse, held: contextlib.ExitStack) -> StreamingResponse:
    """A forwarded event stream, chunk by chunk; `held` (the tenant's slot) ends with it."""

    async def chunks() -> AsyncIterator[bytes]:
        with held:
            try:
                async for chunk in response.chunks():
                    yield chunk
            finally:
                response.close()

    # Also released after the response, in case the client left before the first chunk and the
    # iterator never ran (closing twice is harmless).
    relayed = StreamingResponse(
        chunks(), status_code=response.status, background=BackgroundTask(_closed, held, response)
    )
    relayed.raw_headers = [
        (k, v) for k, v in relayed.raw_headers if k != b"content-type"
    ] + response.relay_headers()
    return relayed


async def _closed(held: contextlib.ExitStack, response: UpstreamResponse) -> None:
    response.close()
    held.close()


def json_object(body: bytes) -> dict[str, Any] | None:
    if body[:1] != b"{":
        return None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None
