"""The gateway's ASGI app. Read top to bottom, this is the request path, for every wire API.

    POST /v1/chat/completions | /v1/responses | /v1/messages    (one `Endpoint` per wire adapter)
      1. authenticate once (401), read the body (413, 408), parse it with the API's adapter (400);
         Messages: `context_management` forwarded, stripped or emulated (`compact_20260112` may
         summarise the history first: `compaction_blocks`)
      2. resolve the model to a Route (404), authorize it (403), hold a tenant slot (429)
      3. pipeline.prepare: count tokens, compute the budget, run the policy chain if over the
         trigger, check the invariants, render the exact bytes to forward in the client's API
      4. attempt: send upstream (to one of the model's upstreams, failing over to the next and
         retried with backoff on 429/5xx/connection failures: retry.py) and look at the answer;
         the result is an Outcome: Relayed, Failed (an upstream error) or Overflow (the
         upstream says the context window was exceeded)
      5. match the outcome: an Overflow with retries left learns the real window and prepares the
         client's original request again against it; anything else is answered
    POST /v1/messages/count_tokens: steps 1-3, then the size of what would be forwarded
    POST /v1/responses/compact (and a `compaction_trigger` item): forwarded where the upstream
      implements it, else answered with a compaction item the gateway issues; in step 1 the
      Responses endpoints read the gateway's own compaction items back into summaries

Everything else has a module of its own (`models_endpoint`, `passthrough` of other /v1/* paths,
`plan_endpoint`, `probes`); `build_app(config)` below wires them all up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route as HttpRoute
from starlette.routing import WebSocketRoute

from . import admin, compaction_blocks
from .accounting import Accounting
from .affinity import conversation_key
from .agent_compaction import CompactionPoints, Signature, recognise
from .asgi import (
    ClientDisconnected,
    DisconnectWatcher,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_bytes,
)
from .auth import Authenticator, Identity
from .calibration import Calibration
from .compaction_answers import CompactionAnswers
from .config import Config, ConfigError, ServerConfig
from .context_errors import ContextError, classify
from .context_management import Applied, apply_to, reported_in_stream, with_report
from .cors import BrowserAccess
from .costs import Accountant, Priced, price_map
from .counting import Counting
from .destinations import destinations, upstream_headers
from .errors import (
    ContextLengthExceededError,
    GatewayError,
    MethodNotAllowedError,
    ModelNotFoundError,
    NotFoundError,
    RouteNotFoundError,
    ShuttingDownError,
    UpstreamError,
    UpstreamTimeoutError,
    reason_of,
    upstream_reason,
)
from .events import EventLog
from .expansion import Expansion, Rounds
from .failover import Balancer, Destination
from .limits import ConcurrencyLimits, register_gauges
from .logs import access_logged, clip, log_request, new_request_id, request_fields
from .memory import freeze_startup_objects
from .metrics import Metrics
from .models_endpoint import get_model, list_models
from .passthrough import passthrough
from .pipeline import Pipeline, Prepared, when_settled
from .plan_endpoint import plan
from .probes import healthz, metrics, readyz
from .readiness import Readiness
from .remote_compaction import (
    AGENT,
    RemoteCompaction,
    compacted_body,
    ends_with_trigger,
    without_trigger,
)
from .responses_socket import ResponsesSocket
from .retry import send_balanced
from .routing import Route, Router
from .sse import UsageStripper
from .store import open_store, signing_key
from .summaries import Precompute, Summarizer, SummaryService
from .tokens import PRIMING_TOKENS
from .tool_outputs import ToolOutputCache
from .upstream import (
    CLIENT_CREDENTIALS,
    ServerFactory,
    UpstreamClient,
    UpstreamResponse,
)
from .upstream.in_process import unserved
from .upstream_counts import UpstreamCounts
from .wire import (
    CHAT,
    COUNT_TOKENS,
    MESSAGES,
    RESPONSES,
    Usage,
    Wire,
    WireRequest,
    answers,
)
from .wire.chat import ChatWire
from .wire.resent import ResentMessages
from .wire.validated import ValidatedMessages

log = logging.getLogger("compactgate")

INTERNAL_ERROR = "The gateway failed on this request; it has been logged with the request id."
IDENTITY = "compactgate.identity"  # scope key: the caller, once authenticated
SHUTTING_DOWN = "The gateway is shutting down and could not finish this response; retry it."
EMPTY_STREAM = "The upstream answered 200 with an empty stream."
CREDENTIALS = frozenset(name.encode() for name in CLIENT_CREDENTIALS)


@dataclass(slots=True)
class Exchange:
    """Per-request facts that end up in headers, metrics and the access log line."""

    request_id: str
    started: float
    api: str = "chat"
    model: str = "-"
    status: int = 0
    reason: str = ""  # the failure kind, when the request failed (errors.ERROR_TABLE, upstream_*)
    stream: bool = False
    upstream_seconds: float = 0.0
    retries: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    tokens_bound: bool = False  # the token figures are an upper bound, not counts (`Prepared`)
    steps: str = "none"
    observe: bool = False
    stateful: bool = False  # the history is held upstream: forwarded as it came
    prepared: Prepared | None = None
    context_errors: list[str] = field(default_factory=list)
    internal_rounds: int = 0  # expansion-tool rounds the gateway answered itself
    priority_preserved: float = 1.0
    usage: Usage | None = None  # what the upstream reported for the answer
    tenant: str = ""
    priced: Priced | None = None  # what the answer cost, and would have without compaction
    edits: Applied = field(default_factory=Applied)  # context_management the gateway emulated
    agent_compaction: str | None = None  # the agent whose own compaction request this is
    agent_outcome: str = "forwarded"  # or answered (from a summary made ahead of need)
    agent_reason: str = ""  # why: ready, not_ready, stale, unanswerable (a transcript), shadow
    failed_in_stream: bool = False  # a 200 stream that carried an error instead of the answer
    requested: str = ""  # the model name the client sent (the log line's `model`)
    compacted: str | None = None  # a Responses compaction the gateway made: ready | summarised
    conversation: str = ""  # the conversation key a load balancer hashes on (gateway.affinity)

    @property
    def answered(self) -> bool:
        """The client got its answer: a 2xx that did not end in an error event."""
        return 200 <= self.status < 300 and not self.failed_in_stream

    @property
    def recovered(self) -> bool:
        """Answered although the upstream refused it with a context-window error first: the
        gateway compacted and retried (a refusal that ran out of retries is not answered)."""
        return self.answered and bool(self.context_errors)

    def failed(self, error: GatewayError) -> None:
        """Note one of our errors as this request's answer."""
        self.status = error.status
        self.reason = reason_of(error)

    def line(self, total: float) -> dict[str, Any]:
        """The request's log line (`logs.request_fields`)."""
        return request_fields(
            request_id=clip(self.request_id),
            tenant=self.tenant,
            api=self.api,
            model=clip(self.requested) if self.requested else self.model,
            status=self.status,
            reason=self.reason,
            stream=self.stream,
            tokens_before=self.tokens_before,
            tokens_after=self.tokens_after,
            tokens_bound=self.tokens_bound,
            steps=self.steps,
            retries=self.retries,
            internal_rounds=self.internal_rounds,
            total_s=total,
            upstream_s=self.upstream_seconds,
        )


# -- what one upstream attempt came to --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Relayed:
    """The answer (or the upstream's own error, not a context one) reached the client."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The upstream answered with an error that is not about the context window."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Overflow:
    """The upstream says the prompt does not fit: a 4xx body, or a stream whose first events
    are an error (`stream` is then still open, `head` what was read of it)."""

    error: ContextError
    failed: Failed | None = None
    stream: UpstreamResponse | None = None
    head: bytes = b""


Outcome = Relayed | Failed | Overflow
RELAYED = Relayed()


@dataclass(frozen=True, slots=True)
class Retries:
    """How many emergency retries (context errors) a request has left: a value, never state."""

    left: int

    def spend(self) -> Retries:
        return Retries(self.left - 1)


class Gateway:
    """Everything the request path needs, created once per app."""

    def __init__(
        self, config: Config, in_process: Mapping[str, ServerFactory] | None = None
    ) -> None:
        self.config = config
        self.metrics = Metrics()
        self.router = Router(config)
        self.upstream = UpstreamClient(config.server, config.providers, in_process)
        self.balancer = Balancer()  # which of a model's upstreams to try first
        self.store = open_store(config.store, self.metrics)
        ref_key = signing_key(
            config.tool_outputs.ref_secret, config.store, self.store, self.metrics
        )
        self.readiness = Readiness(config, self.store)
        self.tool_outputs = ToolOutputCache(self.store, config.tool_outputs)
        self.expansion = Expansion(self.tool_outputs, self.upstream, self.metrics)
        self.costs = Accountant(self.metrics)
        self.compaction_points = CompactionPoints()  # where each tenant's agents compact
        self.compaction_answers = CompactionAnswers(self)  # ... and their answers, ahead of need
        self.remote_compaction = RemoteCompaction(self)  # Responses compaction on any upstream
        self.resent = ResentMessages()  # each conversation's previous parse
        summarizer = Summarizer(
            self.upstream,
            self.router,
            self.metrics,
            config.summaries,
            self.effective_window,
            on_usage=self.own_spend,
            balancer=self.balancer,
        )
        self.summaries = SummaryService(config.summaries, self.store, summarizer, self.metrics)
        self.pipeline = Pipeline(
            self.metrics,
            self.summaries,
            safety_margin=config.server.safety_margin_tokens,
            clamp_max_tokens=config.server.clamp_max_tokens,
            ref_secret=ref_key.value,
            inject_stream_usage=config.server.stream_usage == "inject",
            tool_outputs=self.tool_outputs,
            count_remote=self.count_remote,
            counting=Counting(
                self.store if self.store.shared else None, threads=config.server.count_threads
            ),
        )
        self.upstream_counts = UpstreamCounts(self.upstream)
        self.precompute = Precompute(self.summaries, self.pipeline)
        self.learned_windows: dict[str, int] = {}
        self.calibration = Calibration(self.metrics)
        self.events = EventLog(config.events)
        self.auth = Authenticator(config)
        self.limits = ConcurrencyLimits(config.server.max_concurrent_per_tenant)
        register_gauges(self.metrics.registry, self.limits)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.upstream.start()  # and litellm imported now, if a model uses it
        # The price map (litellm's, about half a second to read) is read now rather than by the
        # first answered request, and frozen with the rest of start-up.
        await asyncio.to_thread(price_map)
        freeze_startup_objects()  # last: everything start-up made stays out of collections
        try:
            yield
        finally:
            await self.summaries.close()  # cancels background summaries
            await self.pipeline.counting.close()  # cancels background counts
            await self.store.close()
            await self.upstream.close()
            self.events.close()

    # -- helpers used along the path ---------------------------------------------------------

    def parse(self, wire: Wire, body: bytes, tenant: str) -> WireRequest:
        """`body` as a request of `wire`'s API (400 when it is not one). What the tenant's
        previous request of the conversation sent alike is not parsed again."""
        return wire.parse(body, self.config.server.max_messages, self.resent.scope(tenant))

    async def count_remote(
        self,
        route: Route,
        wire: Wire,
        texts: Sequence[str],
        client: Sequence[tuple[bytes, bytes]] | None,
    ) -> list[int] | None:
        """Texts counted by the route's upstream, with the credential its requests use."""
        credentials = [(k, v) for k, v in client or () if k.lower() in CREDENTIALS]
        headers = upstream_headers(credentials, route, wire)
        return await self.upstream_counts.count(route, texts, headers)

    def own_spend(self, route: Route, usage: Usage) -> None:
        """A call the gateway made for itself (a summary, or an agent's compaction answered
        ahead of need): priced as the gateway's own spend, and kept with its time for `/ui`."""
        spent = self.costs.own(route, usage)
        self.events.own_spend(None if spent is None or spent.partial else spent.total)

    def effective_window(self, route: Route) -> int | None:
        learned = self.learned_windows.get(route.name)
        if learned is None:
            return route.context_window
        return learned if route.context_window is None else min(route.context_window, learned)

    def authenticate(self, scope: Scope) -> Identity:
        """The caller (401 when gateway keys are required: see auth.py). Its gateway key is then
        removed from the request's headers, so nothing downstream can forward it upstream."""
        identity = scope.get(IDENTITY)
        if identity is None:
            identity = self.auth.identify(scope)
            scope[IDENTITY] = identity
            scope["headers"] = self.auth.upstream_headers(scope["headers"])
        return identity

    def tenant(self, scope: Scope) -> str:
        """Who the request belongs to: the key's tenant, else a tenant header or credential hash."""
        return self.authenticate(scope).tenant

    def finish(self, exchange: Exchange, total: float) -> None:
        """Count a served request and write its log line (every API, passthrough included)."""
        metrics = self.metrics
        metrics.child(metrics.requests, exchange.model, str(exchange.status), exchange.api).inc()
        if access_logged():  # the line is not built for nobody
            log_request(exchange.line(total))

    def learn_window(self, route: Route, error: ContextError) -> None:
        """Lower the model's effective window from an upstream's stated limit; never raise it."""
        if error.limit is None or error.limit <= 0:
            return
        current = self.effective_window(route)
        if current is None or error.limit < current:
            self.learned_windows[route.name] = error.limit
            self.metrics.window_lowered.labels(self.metrics.model_label(route.name)).inc()
            log.warning(
                "model %s: upstream reports a %d-token context window (%s); was %s",
                route.name,
                error.limit,
                error.signature,
                current,
            )


# -- POST /v1/chat/completions, /v1/responses, /v1/messages ------------------------------------


class Endpoint:
    """One compacting endpoint as a plain ASGI app: the request path, for one wire API."""

    precomputes = True  # after an answer, prepare the summaries the conversation will need
    saves = True  # its answers are generated from the compacted prompt (tokens saved count)

    def __init__(self, gateway: Gateway, wire: Wire, api: str | None = None) -> None:
        self.gw = gateway
        self.wire = wire
        self.api = api or wire.name  # as logs and metrics name it
        self.books = Accounting(gateway, self.api, self.saves)  # what each answer comes to

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        incoming_id = header(scope, b"x-request-id")
        exchange = Exchange(
            request_id=incoming_id.decode("latin-1") if incoming_id else new_request_id(),
            started=time.perf_counter(),
            api=self.api,
        )
        gw.metrics.inflight.inc()
        watcher = DisconnectWatcher(receive, send)
        try:
            server = gw.config.server
            identity = gw.authenticate(scope)  # 401 before the body is even read
            exchange.tenant = identity.tenant
            body = await read_body(
                receive, scope, server.max_body_bytes, server.body_read_timeout_s
            )
            request = await self.parse(body, identity.tenant)
            exchange.requested, exchange.stream = request.model, request.stream
            exchange.conversation = conversation_key(
                scope["headers"], request.payload, request.messages, identity.tenant
            ).value
            route = self.route(identity, request)
            request = await self.managed(scope, request, route, exchange)
            exchange.model = gw.metrics.model_label(route.name)
            exchange.stateful = request.stateful
            watcher.start()
            with gw.limits.hold(identity.tenant):  # 429; released however the response ends
                await self.serve(scope, watcher.send, request, route, exchange, identity)
            if exchange.status < 400 and self.precomputes and exchange.agent_compaction is None:
                self.agent_next(identity.tenant, route, request, exchange, scope["headers"])
            # Ahead of need, never delaying this answer (not after a compaction made here).
            if exchange.status < 400 and self.precomputes and exchange.compacted is None:
                gw.precompute.after_response(
                    request,
                    route,
                    identity.tenant,
                    scope["headers"],
                    gw.effective_window(route),
                    exchange.prepared,
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
            gw.metrics.inflight.dec()
            self.books.record(exchange)

    def agent_next(
        self,
        tenant: str,
        route: Route,
        request: WireRequest,
        exchange: Exchange,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """After an ordinary answer: the agent's next compaction summary, if it is near (judged
        on the exact count: after it is made, for a request forwarded on its bound)."""
        answers = self.gw.compaction_answers

        def then(prepared: Prepared | None) -> None:
            exact = prepared if prepared is not None and not prepared.bounded else None
            answers.after_response(tenant, route, request, exact, headers)

        when_settled(exchange.prepared, then)

    async def parse(self, body: bytes, tenant: str) -> WireRequest:
        """The body as this API's request (400 when it is not one)."""
        return self.gw.parse(self.wire, body, tenant)

    async def managed(
        self, scope: Scope, request: WireRequest, route: Route, exchange: Exchange
    ) -> WireRequest:
        """The request with Anthropic's `context_management` as the model's mode wants it
        (`compact_20260112` past its trigger summarises the history first)."""
        request, exchange.edits = apply_to(request, route, self.gw.config.server.max_messages)
        if exchange.edits.compact is not None and self.wire is MESSAGES:
            request = await compaction_blocks.compact(
                self.gw, request, route, exchange.tenant, scope["headers"], exchange.edits
            )
        return request

    def route(self, identity: Identity, request: WireRequest) -> Route:
        """The request's model as a Route this caller may use (404, 403)."""
        self.gw.auth.authorize(identity, request.model)
        route = self.gw.router.resolve(request.model)
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
                await watcher.end_with_error(self.wire.stream_error_event(error))
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
        identity: Identity,
    ) -> None:
        gw = self.gw
        tenant = identity.tenant
        observe = route.mode == "observe"
        if exchange.edits.paused:  # pause_after_compaction: the block is the whole answer
            await self.answer_paused(send, exchange, request, route)
            return
        agent = recognise(request.api, request.messages, gw.config.agent_compaction.signatures)
        if agent is not None and await self.answered_ahead(send, request, route, exchange, agent):
            return  # the agent's own compaction, answered from a summary: nothing sent upstream
        prepared = await gw.pipeline.prepare(
            request,
            route,
            tenant,
            window=gw.effective_window(route),
            observe=observe,
            headers=None if observe else scope["headers"],
            count_late=agent is None,  # an agent's compaction point is learnt from exact counts
        )
        gw.precompute.request_prepared(tenant, route)  # waiting precomputations run meanwhile
        if agent is not None:  # forwarded: where and how this agent compacts is learnt
            gw.compaction_points.seen(tenant, agent.name, prepared.tokens_before)
            if agent.answerable:
                gw.compaction_answers.learn(tenant, agent.name, request, prepared.tokens_before)
            gw.metrics.agent_compactions.labels(agent.name, "forwarded").inc()
        targets = destinations(route, self.wire, scope["headers"])
        retries = Retries(route.max_retries)
        while True:
            outcome = await self.attempt(send, request, route, prepared, exchange, targets, tenant)
            match outcome:
                case Relayed():
                    return
                case Failed():
                    await self.relay_failure(send, exchange, prepared, outcome)
                    return
                case Overflow():
                    self.overflowed(route, exchange, outcome.error)
                    if not retries.left:
                        await self.answer_overflow(send, exchange, prepared, outcome)
                        return
                    retries = retries.spend()
                    exchange.retries += 1
                    gw.metrics.emergency_retries.labels(exchange.model).inc()
                    if outcome.stream is not None:
                        outcome.stream.close()
                    prepared = await self.recompact(
                        request, route, tenant, prepared, outcome, scope["headers"]
                    )

    async def answered_ahead(
        self, send: Send, request: WireRequest, route: Route, exchange: Exchange, agent: Signature
    ) -> bool:
        """Answer an agent's own compaction request from a summary made ahead of need, if one
        covers its history; whether it was (else it is forwarded, and `agent_reason` says why)."""
        gw, tenant = self.gw, exchange.tenant
        exchange.agent_compaction = agent.name
        observe = route.mode == "observe"
        exchange.agent_reason = "shadow" if observe else "unanswerable"
        if not agent.answerable or observe:
            return False
        counted = gw.pipeline.counts(request, route, tenant)
        found = await gw.compaction_answers.answer(tenant, request, counted.uids, counted.counts)
        exchange.agent_reason = found.reason
        if found.text is None:
            return False
        exchange.tokens_before = sum(counted.counts)  # the history it replaces
        await self.answer_from_summary(send, exchange, request, route, found.text)
        return True

    async def answer_from_summary(
        self, send: Send, exchange: Exchange, request: WireRequest, route: Route, text: str
    ) -> None:
        """An agent's compaction request answered with a summary made ahead of need: no
        upstream call, nothing billed (the summary was counted as the gateway's own spend)."""
        content_type, body = answers.answer(request.api, text, route.name, Usage(0), request.stream)
        exchange.status = 200
        exchange.agent_outcome = "answered"
        self.gw.metrics.agent_compactions.labels(exchange.agent_compaction, "answered").inc()
        await send_bytes(send, 200, body, self.books.headers(exchange), content_type)

    async def answer_paused(
        self, send: Send, exchange: Exchange, request: WireRequest, route: Route
    ) -> None:
        """An emulated compaction that pauses: the answer is the compaction block alone."""
        edits = exchange.edits
        answer = compaction_blocks.paused(route.name, edits.compaction or "", edits.report())
        if request.stream:
            body, content_type = compaction_blocks.paused_stream(answer), b"text/event-stream"
        else:
            body, content_type = orjson.dumps(answer), b"application/json"
        exchange.status = 200
        await send_bytes(send, 200, body, self.books.headers(exchange), content_type)

    async def attempt(
        self,
        send: Send,
        request: WireRequest,
        route: Route,
        prepared: Prepared,
        exchange: Exchange,
        targets: list[Destination],
        tenant: str,
    ) -> Outcome:
        """Send `prepared` upstream once (to one of the model's upstreams, failing over) and say
        what came of it; answers are relayed here."""
        gw = self.gw
        started = time.perf_counter()
        if prepared.stored:
            await gw.tool_outputs.save(tenant, prepared.stored)
        if prepared.expandable:  # we read the answer to find internal calls: no gzip
            targets = [
                Destination(
                    d.upstream,
                    d.url,
                    {k: v for k, v in d.headers.items() if k != "accept-encoding"},
                )
                for d in targets
            ]
        try:
            response, chosen = await send_balanced(
                gw.upstream, route, targets, prepared.body, gw.metrics, gw.balancer
            )
        except GatewayError:  # the time spent trying is the upstream's too
            exchange.upstream_seconds += time.perf_counter() - started
            raise
        try:
            if response.status >= 400:
                return await self.error_answer(response)
            if request.stream:
                return await self.relay_stream(
                    send, request, route, prepared, exchange, response, chosen, tenant
                )
            return await self.relay_whole(
                send, request, route, prepared, exchange, response, chosen, tenant
            )
        finally:
            exchange.upstream_seconds += time.perf_counter() - started

    async def error_answer(self, response: UpstreamResponse) -> Failed | Overflow:
        """An upstream's error, read whole: the context window exceeded, or any other failure."""
        body = await response.read()
        response.release()
        failed = Failed(response.status, body, response.relay_headers())
        error = classify(response.status, body)
        return failed if error is None else Overflow(error, failed=failed)

    async def relay_stream(
        self,
        send: Send,
        request: WireRequest,
        route: Route,
        prepared: Prepared,
        exchange: Exchange,
        response: UpstreamResponse,
        chosen: Destination,
        tenant: str,
    ) -> Outcome:
        """A 2xx stream: an overflow if its first events say so, else relayed as it arrives
        (with the internal expansion rounds spliced in when the gateway answers its own tools)."""
        gw = self.gw
        url, sending = chosen.url, dict(chosen.headers)  # later internal rounds go there too
        head = await self.read_head(response)
        error = self.wire.stream_context_error(head)
        if error is not None:
            return Overflow(error, stream=response, head=head)
        if not head:
            response.close()
            raise UpstreamError(EMPTY_STREAM)
        chunks = _stream(head, response)
        if exchange.edits.edits:  # emulated context_management, said where Anthropic does
            chunks = reported_in_stream(chunks, exchange.edits)
        if prepared.expandable and request.api == "chat":
            response, head, exchange.internal_rounds = await gw.expansion.chat.resolve_stream(
                response, head, prepared.body, route, url, sending, tenant
            )
            if response.status >= 400:
                body = await response.read()
                response.release()
                return Failed(response.status, body, response.relay_headers())
            chunks = _stream(head, response)
        elif prepared.expandable:
            rounds = Rounds()
            chunks = gw.expansion.splice(
                request.api,
                response,
                head,
                prepared.body,
                route,
                url,
                sending,
                tenant,
                rounds,
                lambda message: self.wire.stream_error_event(UpstreamError(message)),
            )
            if exchange.edits.edits:
                chunks = reported_in_stream(chunks, exchange.edits)
            await self.relay(send, exchange, prepared, response, chunks, rounds=rounds)
            return RELAYED
        stripper = UsageStripper() if prepared.injected_usage else None
        await self.relay(send, exchange, prepared, response, chunks, stripper)
        return RELAYED

    async def relay_whole(
        self,
        send: Send,
        request: WireRequest,
        route: Route,
        prepared: Prepared,
        exchange: Exchange,
        response: UpstreamResponse,
        chosen: Destination,
        tenant: str,
    ) -> Relayed:
        """A whole (not streamed) answer: internal rounds resolved, priced before its headers
        go out (they say the cost), then sent."""
        gw = self.gw
        url, sending = chosen.url, dict(chosen.headers)  # later internal rounds go there too
        data = await response.read()
        response.release()
        if 200 <= response.status < 300 and not data:
            raise UpstreamError("The upstream answered with an empty body.")
        status, relay_headers = response.status, response.relay_headers()
        if status == 200 and prepared.expandable and gw.expansion.calls_internal(data):
            resolved = await gw.expansion.resolve(
                request.api, data, prepared.body, route, url, sending, tenant
            )
            exchange.internal_rounds = resolved.rounds
            status, data = resolved.status, resolved.body
            relay_headers = resolved.headers or relay_headers
        self.books.note(exchange, prepared)
        exchange.status = status
        usage = None if "content-encoding" in response.headers else self.wire.usage(data)
        self.books.account(prepared, exchange, usage)  # known before the headers: they say it
        if status == 200:
            data = with_report(data, exchange.edits)
        await send_bytes(send, status, data, [*relay_headers, *self.books.headers(exchange)], None)
        self.books.calibrate(route, prepared, exchange, usage)
        return RELAYED

    async def read_head(self, response: UpstreamResponse) -> bytes:
        """The start of a stream, read until it shows what it is (b'' if the stream is empty)."""
        head = b""
        async for chunk in response.chunks():
            head += chunk
            if self.wire.head_decided(head):
                break
        return head

    def overflowed(self, route: Route, exchange: Exchange, error: ContextError) -> None:
        """Count a context error and learn the window it states."""
        self.gw.metrics.context_errors.labels(error.signature).inc()
        exchange.context_errors.append(error.signature)
        self.gw.learn_window(route, error)

    async def answer_overflow(
        self, send: Send, exchange: Exchange, prepared: Prepared, overflow: Overflow
    ) -> None:
        """Out of retries: the upstream's own answer goes to the client (never a silent 200)."""
        if overflow.failed is not None:
            await self.relay_failure(send, exchange, prepared, overflow.failed)
            exchange.reason = "context_overflow"
        elif overflow.stream is not None and overflow.head:
            stream = overflow.stream
            exchange.failed_in_stream = True  # the stream relayed is the upstream's refusal
            await self.relay(send, exchange, prepared, stream, _stream(overflow.head, stream))
        else:
            if overflow.stream is not None:
                overflow.stream.close()
            raise UpstreamError(EMPTY_STREAM)

    async def relay_failure(
        self, send: Send, exchange: Exchange, prepared: Prepared, failed: Failed
    ) -> None:
        """The upstream's error, relayed with its own status and body."""
        self.books.note(exchange, prepared)
        exchange.status, exchange.reason = failed.status, upstream_reason(failed.status)
        await send_bytes(
            send, failed.status, failed.body, [*failed.headers, *self.books.headers(exchange)], None
        )

    async def recompact(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        previous: Prepared,
        overflow: Overflow,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> Prepared:
        """Prepare the client's original request again against a tighter window."""
        pipeline = self.gw.pipeline
        if previous.late is not None:  # the window is learnt in counted tokens, not a bound
            await asyncio.wait([previous.late])
            previous = previous.settled()
        tools = pipeline.tools_tokens(request, route)

        def limit_at(window: int) -> int:
            budget = pipeline.budget(request, route, tools, window)
            return budget.limit if budget is not None else window

        window = _retry_window(self.gw.effective_window(route), previous, overflow.error, limit_at)
        try:
            return await pipeline.prepare(
                request, route, tenant, window=window, force=True, observe=False, headers=headers
            )
        except ContextLengthExceededError:
            if overflow.stream is not None and not overflow.head:
                # An empty stream was only a guess at an overflow: report what happened.
                raise UpstreamError(EMPTY_STREAM) from None
            raise

    async def relay(
        self,
        send: Send,
        exchange: Exchange,
        prepared: Prepared,
        response: UpstreamResponse,
        chunks: AsyncIterator[bytes],
        stripper: UsageStripper | None = None,
        rounds: Rounds | None = None,
    ) -> None:
        """Relay a stream chunk by chunk as it arrives, watching it for its usage (`rounds`
        counts the internal rounds spliced into it)."""
        self.books.note(exchange, prepared)
        exchange.status = response.status
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [*response.relay_headers(), *self.books.headers(exchange)],
            }
        )
        tap = None if "content-encoding" in response.headers else self.wire.usage_tap()
        try:
            async for chunk in chunks:
                if tap is not None:
                    tap.feed(chunk)
                if stripper is not None:
                    chunk = stripper.feed(chunk)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if stripper is not None and (rest := stripper.flush()):
                await send({"type": "http.response.body", "body": rest, "more_body": True})
        except (UpstreamError, UpstreamTimeoutError) as error:
            # Headers are gone: the only way to tell the client is an error event.
            log.warning(
                "request %s: upstream stream failed: %s", exchange.request_id, error.message
            )
            exchange.reason = reason_of(error)
            event = self.wire.stream_error_event(error)
            exchange.failed_in_stream = True
            await send({"type": "http.response.body", "body": event, "more_body": True})
        finally:
            response.close()
            if rounds is not None:
                exchange.internal_rounds = rounds.count
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if tap is not None:
            self.books.account(prepared, exchange, tap.usage)
            self.books.calibrate(prepared.route, prepared, exchange, tap.usage)


class ResponsesEndpoint(Endpoint):
    """POST /v1/responses: the gateway's own compaction items become their summaries as the
    request is parsed (400/410 before anything is sent), and a trailing
    `compaction_trigger` is answered by the gateway where the upstream cannot (`emulate`)."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(gateway, RESPONSES)

    async def parse(self, body: bytes, tenant: str) -> WireRequest:
        request = await super().parse(body, tenant)
        expanded = await self.gw.remote_compaction.expand(request.payload, tenant)
        return request if expanded is None else await super().parse(expanded, tenant)

    async def serve(
        self,
        scope: Scope,
        send: Send,
        request: WireRequest,
        route: Route,
        exchange: Exchange,
        identity: Identity,
    ) -> None:
        if route.responses_compact == "native" or not ends_with_trigger(request):
            await super().serve(scope, send, request, route, exchange, identity)
            return
        gw = self.gw
        history = without_trigger(request, gw.config.server.max_messages)
        compacted = await gw.remote_compaction.compact(
            history, route, identity.tenant, scope["headers"]
        )
        content_type, body = answers.compaction(compacted.item, route.name, request.stream)
        await self.send_compaction(send, exchange, compacted.outcome, body, content_type)

    async def send_compaction(
        self, send: Send, exchange: Exchange, outcome: str, body: bytes, content_type: bytes
    ) -> None:
        exchange.status = 200
        exchange.compacted = outcome
        self.gw.metrics.agent_compactions.labels(AGENT, outcome).inc()
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
        identity: Identity,
    ) -> None:
        gw = self.gw
        if route.responses_compact == "native":
            await self.forward(scope, send, request, route, exchange)
            return
        compacted = await gw.remote_compaction.compact(
            request, route, identity.tenant, scope["headers"]
        )
        body = orjson.dumps(compacted_body(request.payload, compacted.item, route.name))
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
            body = orjson.dumps(self.wire.render(request, None, model, False))
        started = time.perf_counter()
        response, _ = await send_balanced(
            self.gw.upstream,
            route,
            destinations(route, self.wire, scope["headers"], suffix="/compact"),
            body,
            self.gw.metrics,
            self.gw.balancer,
        )
        try:
            data = await response.read()
        finally:
            response.release()
            exchange.upstream_seconds += time.perf_counter() - started
        exchange.status = response.status
        await send_bytes(
            send,
            response.status,
            data,
            [*response.relay_headers(), *self.books.headers(exchange)],
            None,
        )


class CountTokens(Endpoint):
    """POST /v1/messages/count_tokens: the size of what the gateway would forward.

    An agent sizing its own compaction from this must see the request as compacted. The
    compacted body is counted by the upstream when it can (its own tokenizer); when it cannot,
    the gateway's estimate is the answer.
    """

    precomputes = False
    saves = False  # a count is not a generation: nothing billed was saved

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(gateway, COUNT_TOKENS, "count_tokens")

    async def serve(
        self,
        scope: Scope,
        send: Send,
        request: WireRequest,
        route: Route,
        exchange: Exchange,
        identity: Identity,
    ) -> None:
        gw = self.gw
        prepared = await gw.pipeline.prepare(
            request,
            route,
            identity.tenant,
            window=gw.effective_window(route),
            observe=route.mode == "observe",
            remember=False,
        )
        self.books.note(exchange, prepared)
        tokens = prepared.sent_tokens
        targets = destinations(route, self.wire, scope["headers"], suffix="/count_tokens")
        started = time.perf_counter()
        with contextlib.suppress(GatewayError):
            response, _ = await send_balanced(
                gw.upstream, route, targets, prepared.body, gw.metrics, gw.balancer, retry=False
            )
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


async def _stream(head: bytes, response: UpstreamResponse) -> AsyncIterator[bytes]:
    """A stream's bytes: what was read of it already, then the rest as it arrives."""
    if head:
        yield head
    async for chunk in response.chunks():
        yield chunk


def _retry_window(
    current: int | None, previous: Prepared, error: ContextError, limit_at: Callable[[int], int]
) -> int:
    """The window to compact against after a context error: tighter, in our own token units.

    If the upstream said how many tokens the prompt had, scale its limit into our estimate's units
    (our tokenizer may count differently); otherwise aim well below what we just sent.
    Either way the messages then get a budget below what was just sent (90 %, or 60 % when the
    error states no numbers), so every retry makes progress. `limit_at(window)` is the messages
    budget the pipeline derives from a window; the output reserve in it may be a share of the
    window (20 % by default), so the bound is found by search, never by subtracting the previous
    attempt's reserve (that one was a share of the configured, wrong, window).
    """
    sent = previous.sent_tokens
    messages = max(1, sent - previous.tokens_by_region.get("tools", 0) - PRIMING_TOKENS)
    allowance = int(messages * 0.9)
    if error.limit is not None and error.requested is not None and error.requested > 0:
        scaled = int(error.limit * sent / error.requested)
        window = scaled if error.requested > sent else min(scaled, error.limit)
    elif error.limit is not None:
        window = error.limit
    else:
        allowance = int(messages * 0.6)
        window = current if current is not None else max(1, sent)
        for _ in range(64):  # grow until the bound below binds (no window was ever known)
            if limit_at(window) > allowance:
                break
            window *= 2
    if current is not None:
        window = min(window, current)
    if limit_at(window) > allowance:
        low, high = 1, window  # the largest window whose messages budget is within allowance
        while low < high:
            middle = (low + high + 1) // 2
            if limit_at(middle) <= allowance:
                low = middle
            else:
                high = middle - 1
        window = low
    return max(1, window)


# -- the other endpoints (models, passthrough): counted and logged like the path above ---------

Handler = Callable[[Request, Exchange], Awaitable[Response]]


def logged(api: str, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint around `handler` that counts the request and leaves its log line,
    whatever it answers (an error raised is noted, then answered by the error handler)."""

    async def endpoint(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        exchange = Exchange(request_id=_request_id(request), started=time.perf_counter(), api=api)
        try:
            response = await handler(request, exchange)
            exchange.status = response.status_code
            response.headers["x-compactgate-request-id"] = exchange.request_id
            return response
        except GatewayError as error:
            exchange.failed(error)
            error.headers.setdefault("x-compactgate-request-id", exchange.request_id)
            raise
        except Exception:
            exchange.status, exchange.reason = 500, "internal"
            raise
        finally:
            gw.finish(exchange, time.perf_counter() - exchange.started)

    return endpoint


def _request_id(request: Request) -> str:
    incoming = request.headers.get("x-request-id")
    return incoming if incoming else new_request_id()


# -- wiring ----------------------------------------------------------------------------------


async def _on_gateway_error(request: Request, error: Exception) -> Response:
    """Our error in the client's API's shape: Anthropic's when it sent `anthropic-version`."""
    assert isinstance(error, GatewayError)
    wire = MESSAGES if "anthropic-version" in request.headers else CHAT
    return Response(
        wire.error_body(error),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers,
    )


async def _on_http_error(request: Request, error: Exception) -> Response:
    """The router's own answers (no such path, or not with this method), from the table."""
    problem: GatewayError = RouteNotFoundError("Not found.")
    if getattr(error, "status_code", 404) == 405:
        problem = MethodNotAllowedError(str(getattr(error, "detail", "Method Not Allowed")))
    return Response(problem.body(), status_code=problem.status, media_type="application/json")


class _Dispatch:
    """Browser access first (CORS, see cors.py), then the admin gate; the compacting endpoints
    skip Starlette's router; everything else goes through it."""

    def __init__(self, endpoints: dict[str, Any], app: Starlette, server: ServerConfig) -> None:
        self.endpoints = endpoints
        self.app = app
        self.state = app.state
        self.server = server
        self.browser = BrowserAccess(self.dispatch, server.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.browser.cross_origin(scope):
            await self.browser(scope, receive, send)  # then dispatch, if it may go on
            return
        await self.dispatch(scope, receive, send)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if (refused := admin.refusal(scope, self.server)) is not None:
                await admin.send_refusal(send, scope, refused)
                return
            if scope["method"] == "POST":
                endpoint = self.endpoints.get(scope["path"])
                if endpoint is not None:
                    await endpoint(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def build_app(config: Config, in_process: Mapping[str, ServerFactory] | None = None) -> _Dispatch:
    """The ASGI app for `config`. `in_process`: servers embedded with the gateway, by the name
    their upstreams' base_url gives (`upstream.provider: in_process`)."""
    problems = unserved(config, in_process or {})
    if problems:
        raise ConfigError(problems)
    gateway = Gateway(config, in_process)
    responses = ResponsesEndpoint(gateway)
    socket = ResponsesSocket(gateway, responses, config.server)  # Codex's WebSocket transport
    app = Starlette(
        routes=[
            WebSocketRoute("/v1/responses", socket.session),
            HttpRoute("/v1/models", logged("models", list_models), methods=["GET"]),
            HttpRoute("/v1/models/{model_id:path}", logged("models", get_model), methods=["GET"]),
            HttpRoute("/v1/compactgate/plan", plan, methods=["POST"]),
            HttpRoute("/healthz", healthz, methods=["GET"]),
            HttpRoute("/readyz", readyz, methods=["GET"]),
            HttpRoute("/metrics", metrics, methods=["GET"]),
            HttpRoute("/v1/compactgate/events", admin.events, methods=["GET"]),
            HttpRoute("/v1/compactgate/overview", admin.overview, methods=["GET"]),
            HttpRoute("/ui", admin.ui, methods=["GET"]),
            HttpRoute(
                "/v1/{path:path}",
                logged("passthrough", passthrough),
                methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            ),
        ],
        exception_handlers={
            GatewayError: _on_gateway_error,
            404: _on_http_error,
            405: _on_http_error,
        },
        lifespan=gateway.lifespan,
    )
    app.state.gateway = gateway
    endpoints = {
        "/v1/chat/completions": Endpoint(gateway, ChatWire(ValidatedMessages())),
        "/v1/responses": responses,
        "/v1/responses/compact": CompactEndpoint(gateway),
        "/v1/messages": Endpoint(gateway, MESSAGES),
        "/v1/messages/count_tokens": CountTokens(gateway),
    }
    return _Dispatch(endpoints, app, config.server)


def create_app() -> _Dispatch:
    """App factory for `uvicorn --factory` / several workers: config from COMPACTGATE_CONFIG."""
    from .config import default_config, load_config

    path = os.environ.get("COMPACTGATE_CONFIG")
    return build_app(load_config(path) if path else default_config())
