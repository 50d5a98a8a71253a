"""The compacting endpoints, one thin ASGI handler per wire API (design D9).

    POST /v1/chat/completions | /v1/responses | /v1/messages
      1. authenticate once (401), read the body (413, 408), parse it with the API's adapter (400)
      2. resolve the model to a Route (404), authorize it (403), hold a tenant slot (429)
      3. agents' hooks: an agent's own compaction request answered from a summary made ahead
         of need (nothing sent upstream)
      4. the engine: count, budget, the policy chain when over the trigger, the invariants, the
         exact bytes to forward (`engine.Engine.prepare`)
      5. the forwarder: send upstream, relay the answer, and on a context error compact harder
         and retry (`path.forward`)
      6. after the answer, ahead of need: agents' next compaction, the policy's summaries
    POST /v1/messages/count_tokens: steps 1-4, then the size of what would be forwarded
    POST /v1/responses/compact (and a trailing `compaction_trigger` item): forwarded where the
      upstream implements it, else answered with a compaction item the gateway issues
      (`responses.py`)

Each API's differences live in its handler class here and in its wire adapter; the shared path
(`Endpoint`) never asks which API it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import orjson

from ..agents.context_management import Applied, ContextManagement, apply_to
from ..agents.hooks import AgentHooks
from ..asgi import (
    ClientDisconnected,
    DisconnectWatcher,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_bytes,
)
from ..config import ServerConfig
from ..engine.engine import Engine
from ..errors import (
    GatewayError,
    ModelNotFoundError,
    ShuttingDownError,
    reason_of,
)
from ..ops.logs import new_request_id
from ..ops.metrics import Metrics
from ..path.accounting import Accounting
from ..path.affinity import conversation_key
from ..path.exchange import Exchange
from ..path.forward import Call, Forwarder
from ..path.outcome import PLAIN, Decoration
from ..path.windows import Windows
from ..routing import Route, Router
from ..upstream.destinations import destinations
from ..upstream.retry import Sender
from ..wire import Wire, WireRequest
from ..wire.resent import ResentMessages
from .auth import Authenticator, Identity
from .limits import ConcurrencyLimits

log = logging.getLogger("compactgate")

INTERNAL_ERROR = "The gateway failed on this request; it has been logged with the request id."
SHUTTING_DOWN = "The gateway is shutting down and could not finish this response; retry it."


@dataclass(frozen=True, slots=True)
class Doorway:
    """What every compacting endpoint uses to take a request in: who calls, under which
    limits, for which model."""

    auth: Authenticator
    router: Router
    limits: ConcurrencyLimits
    metrics: Metrics
    server: ServerConfig
    resent: ResentMessages  # each conversation's previous parse (design D9.9)


@dataclass(frozen=True, slots=True)
class Serving:
    """What the compacting endpoints use to serve a request once it is in."""

    engine: Engine
    forwarder: Forwarder
    hooks: AgentHooks
    windows: Windows


class Endpoint:
    """One compacting endpoint as a plain ASGI app: the request path, for one wire API."""

    precomputes = True  # after an answer, prepare the summaries the conversation will need

    def __init__(self, door: Doorway, serving: Serving, wire: Wire, books: Accounting) -> None:
        self.door = door
        self.serving = serving
        self.wire = wire
        self.api = books.api  # as logs and metrics name it
        self.books = books  # what each answer comes to

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door = self.door
        incoming_id = header(scope, b"x-request-id")
        exchange = Exchange(
            request_id=incoming_id.decode("latin-1") if incoming_id else new_request_id(),
            started=time.perf_counter(),
            api=self.api,
        )
        door.metrics.inflight.inc()
        watcher = DisconnectWatcher(receive, send)
        try:
            server = door.server
            identity = door.auth.authenticate(scope)  # 401 before the body is even read
            exchange.tenant = identity.tenant
            body = await read_body(
                receive,
                scope,
                server.max_body_bytes,
                server.body_read_timeout_s,
                server.max_drain_bytes,
            )
            request = await self.parse(body, identity.tenant)
            exchange.requested, exchange.stream = request.model, request.stream
            exchange.conversation = conversation_key(
                scope["headers"], request.payload, request.messages, identity.tenant
            ).value
            route = self.route(identity, request)
            request, decoration = await self.managed(scope, request, route, exchange)
            exchange.model = door.metrics.model_label(route.name)
            exchange.stateful = request.stateful
            watcher.start()
            with door.limits.hold(identity.tenant):  # 429; released however the response ends
                await self.serve(scope, watcher.send, request, route, exchange, decoration)
            if exchange.status < 400 and self.precomputes:
                self.serving.hooks.after(
                    identity.tenant, route, request, exchange, scope["headers"]
                )
        except GatewayError as error:
            await self.report(watcher, exchange, error)
        except ClientDisconnected:
            exchange.status, exchange.reason = 499, "client_disconnected"
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            if watcher.disconnected:
                exchange.status, exchange.reason = 499, "client_disconnected"
            else:  # the server's shutdown deadline passed: end the response cleanly
                await self.report(watcher, exchange, ShuttingDownError(SHUTTING_DOWN))
        except Exception:
            log.exception("request %s: internal error", exchange.request_id)
            await self.report(watcher, exchange, GatewayError(INTERNAL_ERROR))
        finally:
            watcher.stop()
            door.metrics.inflight.dec()
            self.books.record(exchange)

    async def parse(self, body: bytes, tenant: str) -> WireRequest:
        """The body as this API's request (400 when it is not one). What the tenant's previous
        request of the conversation sent alike is not parsed again."""
        door = self.door
        return self.wire.parse(body, door.server.max_messages, door.resent.scope(tenant))

    async def managed(
        self, scope: Scope, request: WireRequest, route: Route, exchange: Exchange
    ) -> tuple[WireRequest, Decoration]:
        """The request as the API's own request-level features want it before it is served,
        and what they add to its answer (nothing, but for Messages)."""
        return request, PLAIN

    def route(self, identity: Identity, request: WireRequest) -> Route:
        """The request's model as a Route this caller may use (404, 403)."""
        self.door.auth.authorize(identity, request.model)
        route = self.door.router.resolve(request.model)
        if route is None:
            raise ModelNotFoundError(
                f"The model `{request.model}` does not exist or is not served by this gateway.",
                param="model",
            )
        return route

    async def report(
        self, watcher: DisconnectWatcher, exchange: Exchange, error: GatewayError
    ) -> None:
        """Send `error` as the response, in this API's shape; when the response has already
        started (a stream that stalled or outlived the shutdown deadline), as its last event."""
        exchange.reason = reason_of(error)
        with contextlib.suppress(OSError, RuntimeError):  # the client may be gone already
            if watcher.started:
                sequence = exchange.framing.next_sequence if exchange.framing else 0
                await watcher.end_with_error(self.wire.stream_error_event(error, sequence))
                return
            exchange.status = error.status
            headers = [
                (b"x-compactgate-request-id", exchange.request_id.encode("latin-1", "replace"))
            ]
            if exchange.retries:  # e.g. nothing fits after the upstream's context error
                headers.append((b"x-compactgate-retries", str(exchange.retries).encode()))
            headers.extend((k.encode(), v.encode()) for k, v in error.headers.items())
            await send_bytes(
                watcher.send,
                error.status,
                self.wire.error_body(error),
                headers,
                b"application/json",
            )

    async def serve(
        self,
        scope: Scope,
        send: Send,
        request: WireRequest,
        route: Route,
        exchange: Exchange,
        decoration: Decoration,
    ) -> None:
        serving = self.serving
        tenant = exchange.tenant
        observe = route.mode == "observe"
        before = await serving.hooks.before(send, request, route, exchange, self.books)
        if before.answered:
            return  # the agent's own compaction, answered from a summary: nothing sent upstream
        prepared = await serving.engine.prepare(
            request,
            route,
            tenant,
            window=serving.windows.effective(route),
            observe=observe,
            headers=None if observe else scope["headers"],
            count_late=before.agent is None,  # an agent's compaction point is learnt exactly
        )
        serving.hooks.prepared(tenant, route, request, before, prepared, scope["headers"])
        call = Call(
            wire=self.wire,
            request=request,
            route=route,
            tenant=tenant,
            targets=destinations(route, self.wire, scope["headers"]),
            books=self.books,
            decoration=decoration,
            headers=scope["headers"],
        )
        await serving.forwarder.forward(send, call, prepared, exchange)


class MessagesEndpoint(Endpoint):
    """POST /v1/messages: Anthropic's `context_management` forwarded, stripped or emulated as
    the model's mode says (`compact_20260112` past its trigger summarises the history first,
    and with `pause_after_compaction` the compaction block is the whole answer)."""

    def __init__(
        self,
        door: Doorway,
        serving: Serving,
        wire: Wire,
        books: Accounting,
        context_management: ContextManagement,
    ) -> None:
        super().__init__(door, serving, wire, books)
        self.context_management = context_management

    async def managed(
        self, scope: Scope, request: WireRequest, route: Route, exchange: Exchange
    ) -> tuple[WireRequest, Decoration]:
        return await self.context_management.apply(
            request, route, exchange.tenant, scope["headers"]
        )

    async def serve(
        self,
        scope: Scope,
        send: Send,
        request: WireRequest,
        route: Route,
        exchange: Exchange,
        decoration: Decoration,
    ) -> None:
        if isinstance(decoration, Applied) and decoration.paused:
            await self.answer_paused(send, exchange, request, route, decoration)
            return
        await super().serve(scope, send, request, route, exchange, decoration)

    async def answer_paused(
        self,
        send: Send,
        exchange: Exchange,
        request: WireRequest,
        route: Route,
        edits: Applied,
    ) -> None:
        """An emulated compaction that pauses: the answer is the compaction block alone."""
        from ..agents import blocks

        answer = blocks.paused(route.name, edits.compaction or "", edits.report())
        if request.stream:
            body, content_type = blocks.paused_stream(answer), b"text/event-stream"
        else:
            body, content_type = orjson.dumps(answer), b"application/json"
        exchange.status = 200
        await send_bytes(send, 200, body, self.books.headers(exchange), content_type)


class CountTokens(Endpoint):
    """POST /v1/messages/count_tokens: the size of what the gateway would forward.

    An agent sizing its own compaction from this must see the request as compacted. The
    compacted body is counted by the upstream when it can (its own tokenizer); when it cannot,
    the gateway's estimate is the answer.
    """

    precomputes = False

    def __init__(
        self, door: Doorway, serving: Serving, wire: Wire, books: Accounting, sender: Sender
    ) -> None:
        super().__init__(door, serving, wire, books)
        self.sender = sender

    async def managed(
        self, scope: Scope, request: WireRequest, route: Route, exchange: Exchange
    ) -> tuple[WireRequest, Decoration]:
        """`context_management` stripped or emulated as for `/v1/messages` (but a compaction
        edit: counting a request never summarises it)."""
        return apply_to(request, route, self.door.server.max_messages)

    async def serve(
        self,
        scope: Scope,
        send: Send,
        request: WireRequest,
        route: Route,
        exchange: Exchange,
        decoration: Decoration,
    ) -> None:
        serving = self.serving
        prepared = await serving.engine.prepare(
            request,
            route,
            exchange.tenant,
            window=serving.windows.effective(route),
            observe=route.mode == "observe",
            remember=False,
        )
        self.books.note(exchange, prepared)
        tokens = prepared.sent_tokens
        targets = destinations(route, self.wire, scope["headers"], suffix="/count_tokens")
        started = time.perf_counter()
        with contextlib.suppress(GatewayError):
            response, _ = await self.sender.send(route, targets, prepared.body, retry=False)
            try:
                data = await response.read() if response.status == 200 else b""
            finally:
                response.release()
            counted = orjson.loads(data).get("input_tokens") if data[:1] == b"{" else None
            if isinstance(counted, int) and not isinstance(counted, bool):
                tokens = counted
        exchange.upstream_seconds += time.perf_counter() - started
        exchange.status = 200
        body = orjson.dumps({"input_tokens": tokens})
        await send_bytes(send, 200, body, self.books.headers(exchange), b"application/json")
