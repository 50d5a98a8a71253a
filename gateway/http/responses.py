"""POST /v1/responses and /v1/responses/compact: the Responses API's own request-level
features on top of the shared path (`endpoints.Endpoint`).

The gateway's own compaction items become their summaries as the request is parsed (400/410
before anything is sent, `agents.remote`); a trailing `compaction_trigger` item, and
`/v1/responses/compact`, are forwarded where the model's upstream implements remote compaction
(`responses_compact: native`), else answered with a compaction item the gateway issues.
"""

from __future__ import annotations

import time

from ..agents.refs import MARK
from ..agents.remote import (
    AGENT,
    RemoteCompaction,
    compacted_body,
    ends_with_trigger,
    without_trigger,
)
from ..asgi import Scope, Send, send_bytes
from ..errors import NotFoundError
from ..path.accounting import Accounting
from ..path.exchange import Exchange
from ..path.outcome import Decoration
from ..routing import Route
from ..upstream.destinations import destinations
from ..upstream.retry import Sender
from ..wire import Wire, WireRequest, answers
from ..wire.fields import load_object, serialise
from ..wire.framing import answer_problem
from .endpoints import Doorway, Endpoint, Serving


class ResponsesEndpoint(Endpoint):
    """POST /v1/responses: the gateway's own compaction items become their summaries as the
    request is parsed (400/410 before anything is sent), and a trailing
    `compaction_trigger` is answered by the gateway where the upstream cannot (`emulate`)."""

    def __init__(
        self,
        door: Doorway,
        serving: Serving,
        wire: Wire,
        books: Accounting,
        remote: RemoteCompaction,
        sender: Sender,
    ) -> None:
        super().__init__(door, serving, wire, books)
        self.remote = remote
        self.sender = sender

    async def parse(self, body: bytes, tenant: str) -> WireRequest:
        """The body parsed once: our compaction items (when its bytes may hold one) read back
        into their summaries first."""
        if MARK in body:
            expanded = await self.remote.expand(load_object(body), tenant)
            if expanded is not None:
                body = expanded
        return await super().parse(body, tenant)

    async def serve(
        self,
        scope: Scope,
        send: Send,
        request: WireRequest,
        route: Route,
        exchange: Exchange,
        decoration: Decoration,
    ) -> None:
        if route.responses_compact == "native" or not ends_with_trigger(request):
            await super().serve(scope, send, request, route, exchange, decoration)
            return
        history = without_trigger(request, self.door.server.max_messages)
        compacted = await self.remote.compact(history, route, exchange.tenant, scope["headers"])
        content_type, body = answers.compaction(compacted.item, route.name, request.stream)
        await self.send_compaction(send, exchange, compacted.outcome, body, content_type)

    async def send_compaction(
        self, send: Send, exchange: Exchange, outcome: str, body: bytes, content_type: bytes
    ) -> None:
        exchange.status = 200
        exchange.compacted = outcome
        self.door.metrics.agent_compactions.labels(AGENT, outcome).inc()
        await send_bytes(send, 200, body, self.books.headers(exchange), content_type)


class CompactEndpoint(ResponsesEndpoint):
    """POST /v1/responses/compact: forwarded to an upstream that implements it (`native`),
    else the gateway summarises the input and answers in OpenAI's shape (`emulate`)."""

    precomputes = False

    async def serve(
        self,
        scope: Scope,
        send: Send,
        request: WireRequest,
        route: Route,
        exchange: Exchange,
        decoration: Decoration,
    ) -> None:
        if route.responses_compact == "native":
            await self.forward(scope, send, request, route, exchange)
            return
        compacted = await self.remote.compact(request, route, exchange.tenant, scope["headers"])
        body = serialise(compacted_body(request.payload, compacted.item, route.name))
        await self.send_compaction(send, exchange, compacted.outcome, body, b"application/json")

    async def forward(
        self, scope: Scope, send: Send, request: WireRequest, route: Route, exchange: Exchange
    ) -> None:
        """The compact request, as the client sent it (our own items read back), upstream."""
        if route.upstream.base_url is None or route.upstream.provider == "litellm":
            raise NotFoundError(f"The model `{route.name}` has no upstream for /responses/compact.")
        body = request.body
        if route.renamed or request.has_extension:  # our marks never reach an upstream
            model = route.upstream_model if route.renamed else None
            body = serialise(self.wire.render(request, None, model, False))
        started = time.perf_counter()
        targets = destinations(route, self.wire, scope["headers"], suffix="/compact")
        response, _ = await self.sender.send(route, targets, body)
        try:
            data = await response.read()
        finally:
            response.release()
            exchange.upstream_seconds += time.perf_counter() - started
        if 200 <= response.status < 300 and "content-encoding" not in response.headers:
            if (malformed := answer_problem(self.wire, data)) is not None:
                raise malformed
        exchange.status = response.status
        await send_bytes(
            send,
            response.status,
            data,
            [*response.relay_headers(), *self.books.headers(exchange)],
            None,
        )
