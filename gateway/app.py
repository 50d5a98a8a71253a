"""The gateway's ASGI app. Read top to bottom, this is the request path.

    POST /v1/chat/completions
      1. read the body (413 past max_body_bytes, 408 if trickled), parse and validate it (400)
      2. resolve the model to a Route (404 model_not_found)
      3. pipeline.prepare: count tokens, compute the budget, run the policy chain if over the
         trigger, check the invariants, build the exact bytes to forward
      4. send upstream (retrying 429/5xx/connection failures with backoff)
      5. if the upstream says "context length exceeded": learn the real window, prepare again
         from the client's original request against it, retry (at most max_retries)
      6. relay the status, headers and body (stream chunks as they arrive), adding ours

Everything else (models list, passthrough of other /v1/* paths, plan, health, metrics) is below
the chat path. `build_app(config)` wires it up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HttpRoute

from . import admin, litellm_upstream
from .asgi import (
    ClientDisconnected,
    DisconnectWatcher,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_bytes,
    send_error,
)
from .auth import Authenticator, Identity
from .calibration import Calibration, prompt_tokens_from_json, prompt_tokens_from_sse
from .chat_request import ChatRequest, parse_chat_request
from .config import Config, ServerConfig
from .context_errors import ContextError, classify
from .errors import (
    ContextLengthExceededError,
    GatewayError,
    ModelNotFoundError,
    NotFoundError,
    ShuttingDownError,
    UpstreamError,
    UpstreamTimeoutError,
)
from .events import EventLog, reward
from .expansion import Expansion
from .limits import ConcurrencyLimits, register_gauges
from .memory import freeze_startup_objects
from .metrics import Metrics
from .pipeline import Pipeline, Prepared
from .retry import send_with_retries
from .routing import Route, Router
from .sse import UsageStripper
from .stores import open_store
from .summaries import Precompute, SummaryService
from .summarizer import Summarizer
from .tokens import PRIMING_TOKENS
from .tool_outputs import ToolOutputCache
from .upstream import UpstreamClient, UpstreamResponse, forward_headers, passthrough_path

log = logging.getLogger("compactgate")
access_log = logging.getLogger("compactgate.access")

CHAT_PATH = "/v1/chat/completions"
INTERNAL_ERROR = "The gateway failed on this request; it has been logged with the request id."
IDENTITY = "compactgate.identity"  # scope key: the caller, once authenticated
SHUTTING_DOWN = "The gateway is shutting down and could not finish this response; retry it."
STREAM_TAIL_BYTES = 8192  # the end of a stream is kept to read its usage chunk


@dataclass(slots=True)
class Exchange:
    """Per-request facts that end up in headers, metrics and the access log line."""

    request_id: str
    started: float
    model: str = "-"
    status: int = 0
    upstream_seconds: float = 0.0
    retries: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    steps: str = "none"
    observe: bool = False
    prepared: Prepared | None = None
    context_errors: list[str] = field(default_factory=list)
    internal_rounds: int = 0  # expansion-tool rounds the gateway answered itself
    priority_preserved: float = 1.0


class Gateway:
    """Everything the request path needs, created once per app."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.router = Router(config)
        self.upstream = UpstreamClient(config.server)
        self.store = open_store(config.store, self.metrics)
        self.tool_outputs = ToolOutputCache(self.store, config.tool_outputs)
        self.expansion = Expansion(self.tool_outputs, self.upstream, self.metrics)
        summarizer = Summarizer(
            self.upstream, self.router, self.metrics, config.summaries, self.effective_window
        )
        self.summaries = SummaryService(config.summaries, self.store, summarizer, self.metrics)
        self.pipeline = Pipeline(
            self.metrics,
            safety_margin=config.server.safety_margin_tokens,
            clamp_max_tokens=config.server.clamp_max_tokens,
            ref_secret=os.urandom(32),
            inject_stream_usage=config.server.stream_usage == "inject",
            fetch_summaries=self.summaries.fetch,
            tool_outputs=self.tool_outputs,
            summary_source=self.summaries.source,
        )
        self.precompute = Precompute(self.summaries, self.pipeline)
        self.learned_windows: dict[str, int] = {}
        self.calibration = Calibration(self.metrics)
        self.events = EventLog(config.events)
        self.auth = Authenticator(config)
        self.limits = ConcurrencyLimits(config.server.max_concurrent_per_tenant)
        register_gauges(self.metrics.registry, self.limits)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.upstream.start()
        if any(m.upstream.provider == "litellm" for m in self.config.models):
            await litellm_upstream.warm_up()  # import it now, not on the first request
        self.pipeline.ref_secret = await self.shared_secret()
        freeze_startup_objects()  # last: everything start-up made stays out of collections
        try:
            yield
        finally:
            await self.summaries.close()  # cancels background summaries
            await self.store.close()
            await self.upstream.close()
            self.events.close()

    async def shared_secret(self) -> bytes:
        """The key of tool-output refs: the same on every replica that shares a store.

        Equal refs for equal outputs keep a compacted prefix byte-identical whichever replica
        served the request (provider prompt caches keep hitting). Configured, or created once in
        a shared store, or (memory store) random per process.
        """
        configured = self.config.tool_outputs.ref_secret
        if configured:
            return configured.encode()
        if not self.config.store.startswith(("redis://", "rediss://")):
            return os.urandom(32)
        key = "ref-secret"
        found = await self.store.get(key)
        if found is None:
            lock = await self.store.lock(key + ":init", 5)
            try:
                found = await self.store.get(key)
                if found is None:
                    found = os.urandom(32).hex().encode()
                    await self.store.put(key, found, None)
            finally:
                if lock is not None:
                    await self.store.release(lock)
        return found

    # -- helpers used along the path ---------------------------------------------------------

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


# -- POST /v1/chat/completions ---------------------------------------------------------------


class ChatCompletions:
    """The chat-completions endpoint as a plain ASGI app."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        incoming_id = header(scope, b"x-request-id")
        exchange = Exchange(
            request_id=incoming_id.decode("latin-1") if incoming_id else uuid.uuid4().hex,
            started=time.perf_counter(),
        )
        gw.metrics.inflight.inc()
        watcher = DisconnectWatcher(receive, send)
        try:
            server = gw.config.server
            identity = gw.authenticate(scope)  # 401 before the body is even read
            body = await read_body(
                receive, scope, server.max_body_bytes, server.body_read_timeout_s
            )
            request = parse_chat_request(body, server.max_messages)
            gw.auth.authorize(identity, request.model)  # 403
            route = gw.router.resolve(request.model)
            if route is None:
                raise ModelNotFoundError(
                    f"The model `{request.model}` does not exist or is not served by this gateway.",
                    param="model",
                )
            exchange.model = gw.metrics.model_label(route.name)
            watcher.start()
            with gw.limits.hold(identity.tenant):  # 429; released however the response ends
                await self.serve(scope, watcher.send, request, route, exchange)
            if exchange.status < 400:  # ahead of need (R4.6): never delays this response
                gw.precompute.after_response(
                    request,
                    route,
                    gw.tenant(scope),
                    scope["headers"],
                    gw.effective_window(route),
                    exchange.prepared,
                )
        except GatewayError as error:
            await self.report(watcher, exchange, error)
        except ClientDisconnected:
            exchange.status = 499
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            if watcher.disconnected:
                exchange.status = 499
            else:  # the server's shutdown deadline passed: end the response cleanly
                await self.report(watcher, exchange, ShuttingDownError(SHUTTING_DOWN))
        except Exception:
            log.exception("request %s: internal error", exchange.request_id)
            await self.report(watcher, exchange, GatewayError(INTERNAL_ERROR))
        finally:
            watcher.stop()
            gw.metrics.inflight.dec()
            self.record(exchange)

    async def report(
        self, watcher: DisconnectWatcher, exchange: Exchange, error: GatewayError
    ) -> None:
        """Send `error` as the response, or, when the response has already started (a stream
        that stalled or outlived the shutdown deadline), as its last event."""
        with contextlib.suppress(OSError, RuntimeError):  # the client may be gone already
            if watcher.started:
                await watcher.end_with_error(error)
                return
            exchange.status = error.status
            request_id = exchange.request_id.encode("latin-1", "replace")
            headers = [(b"x-compactgate-request-id", request_id)]
            if exchange.retries:  # e.g. nothing fits after the upstream's context error
                headers.append((b"x-compactgate-retries", str(exchange.retries).encode()))
            await send_error(watcher.send, error, headers)

    async def serve(
        self, scope: Scope, send: Send, request: ChatRequest, route: Route, exchange: Exchange
    ) -> None:
        gw = self.gw
        tenant = gw.tenant(scope)
        observe = route.mode == "observe"
        prepared = await gw.pipeline.prepare(
            request,
            route,
            tenant,
            window=gw.effective_window(route),
            observe=observe,
            headers=None if observe else scope["headers"],
        )
        gw.precompute.request_prepared(tenant, route)  # waiting precomputations run meanwhile
        url = route.chat_url
        if url is None:
            raise NotFoundError(f"The model `{route.name}` has no chat upstream.")
        headers = forward_headers(scope["headers"], route.upstream.api_key, route.upstream.headers)
        while True:
            up_started = time.perf_counter()
            sending = headers
            if prepared.stored:
                await gw.tool_outputs.save(tenant, prepared.stored)
            if prepared.expandable:  # we read the answer to find internal calls: no gzip
                sending = {k: v for k, v in headers.items() if k != "accept-encoding"}
            response = await send_with_retries(
                gw.upstream, route, url, sending, prepared.body, gw.metrics
            )
            if response.status >= 400:
                error_body = await response.read()
                response.release()
                context_error = classify(response.status, error_body)
                if context_error is not None and await self.can_retry(
                    route, exchange, context_error
                ):
                    prepared = await self.recompact(
                        request, route, tenant, prepared, context_error, observe, scope["headers"]
                    )
                    continue
                exchange.upstream_seconds += time.perf_counter() - up_started
                self.note(exchange, prepared)
                exchange.status = response.status
                await send_bytes(
                    send,
                    response.status,
                    error_body,
                    [*response.relay_headers(), *self.headers(exchange)],
                    None,
                )
                return
            if request.stream:
                first = await _first_chunk(response)
                context_error = _stream_context_error(first)
                if context_error is not None and await self.can_retry(
                    route, exchange, context_error
                ):
                    response.close()
                    try:
                        prepared = await self.recompact(
                            request,
                            route,
                            tenant,
                            prepared,
                            context_error,
                            observe,
                            scope["headers"],
                        )
                    except ContextLengthExceededError:
                        if first:  # the upstream said the context overflowed: that is the answer
                            raise
                        # An empty stream was only a guess at an overflow: report what happened.
                        raise UpstreamError(
                            "The upstream answered 200 with an empty stream."
                        ) from None
                    continue
                if not first:  # retries spent: never relay a silent empty 200
                    response.close()
                    raise UpstreamError("The upstream answered 200 with an empty stream.")
                if prepared.expandable:
                    response, first, exchange.internal_rounds = await gw.expansion.resolve_stream(
                        response, first, prepared.body, route, url, sending, tenant
                    )
                    if response.status >= 400:
                        error_body = await response.read()
                        response.release()
                        self.note(exchange, prepared)
                        exchange.status = response.status
                        await send_bytes(
                            send,
                            response.status,
                            error_body,
                            [*response.relay_headers(), *self.headers(exchange)],
                            None,
                        )
                        return
                self.note(exchange, prepared)
                exchange.status = response.status
                stripper = UsageStripper() if prepared.injected_usage else None
                tail = await self.relay_stream(send, response, first, exchange, stripper)
                exchange.upstream_seconds += time.perf_counter() - up_started
                self.calibrate(
                    route,
                    prepared,
                    prompt_tokens_from_sse(stripper.usage_event if stripper else tail),
                )
                return
            data = await response.read()
            response.release()
            if 200 <= response.status < 300 and not data:
                raise UpstreamError("The upstream answered with an empty body.")
            status, relay_headers = response.status, response.relay_headers()
            if status == 200 and prepared.expandable and gw.expansion.calls_internal(data):
                resolved = await gw.expansion.resolve(
                    data, prepared.body, route, url, sending, tenant
                )
                exchange.internal_rounds = resolved.rounds
                status, data = resolved.status, resolved.body
                relay_headers = resolved.headers or relay_headers
            exchange.upstream_seconds += time.perf_counter() - up_started
            self.note(exchange, prepared)
            exchange.status = status
            await send_bytes(send, status, data, [*relay_headers, *self.headers(exchange)], None)
            if "content-encoding" not in response.headers:
                self.calibrate(route, prepared, prompt_tokens_from_json(data))
            return

    def calibrate(self, route: Route, prepared: Prepared, reported: int | None) -> None:
        """Compare what the upstream says the prompt was with our estimate (R2.6)."""
        if reported is not None:
            self.gw.calibration.observe(route, prepared.sent_tokens, reported)

    async def can_retry(self, route: Route, exchange: Exchange, error: ContextError) -> bool:
        self.gw.metrics.context_errors.labels(error.signature).inc()
        exchange.context_errors.append(error.signature)
        self.gw.learn_window(route, error)
        if exchange.retries >= route.max_retries:
            return False
        exchange.retries += 1
        self.gw.metrics.emergency_retries.labels(exchange.model).inc()
        return True

    async def recompact(
        self,
        request: ChatRequest,
        route: Route,
        tenant: str,
        previous: Prepared,
        error: ContextError,
        observe: bool,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> Prepared:
        """Prepare the client's original request again against a tighter window."""
        pipeline = self.gw.pipeline
        tools = pipeline.tools_tokens(request, route)

        def limit_at(window: int) -> int:
            budget = pipeline.budget(request, route, tools, window)
            return budget.limit if budget is not None else window

        window = _retry_window(self.gw.effective_window(route), previous, error, limit_at)
        return await self.gw.pipeline.prepare(
            request, route, tenant, window=window, force=True, observe=False, headers=headers
        )

    async def relay_stream(
        self,
        send: Send,
        response: UpstreamResponse,
        first: bytes,
        exchange: Exchange,
        stripper: UsageStripper | None = None,
    ) -> bytes:
        """Relay the stream chunk by chunk as it arrives; returns its last bytes (for usage)."""
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [*response.relay_headers(), *self.headers(exchange)],
            }
        )
        tail = first[-STREAM_TAIL_BYTES:]
        try:
            if stripper is not None:
                first = stripper.feed(first)
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in response.chunks():
                tail = (tail + chunk)[-STREAM_TAIL_BYTES:]
                if stripper is not None:
                    chunk = stripper.feed(chunk)
                    if not chunk:
                        continue
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if stripper is not None and (rest := stripper.flush()):
                await send({"type": "http.response.body", "body": rest, "more_body": True})
        except (UpstreamError, UpstreamTimeoutError) as error:
            # Headers are gone: the only way to tell the client is an SSE error event.
            log.warning(
                "request %s: upstream stream failed: %s", exchange.request_id, error.message
            )
            event = b"data: " + error.body() + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        finally:
            response.close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return tail

    def note(self, exchange: Exchange, prepared: Prepared) -> None:
        exchange.prepared = prepared
        exchange.priority_preserved = prepared.priority_preserved
        exchange.tokens_before = prepared.tokens_before
        exchange.tokens_after = prepared.tokens_after
        exchange.observe = prepared.observe
        steps = prepared.changed_steps
        exchange.steps = ",".join(steps) if steps else "none"

    def headers(self, exchange: Exchange) -> list[tuple[bytes, bytes]]:
        prefix = b"x-compactgate-would-" if exchange.observe else b"x-compactgate-"
        return [
            (b"x-compactgate-request-id", exchange.request_id.encode("latin-1", "replace")),
            (prefix + b"tokens-before", str(exchange.tokens_before).encode()),
            (prefix + b"tokens-after", str(exchange.tokens_after).encode()),
            (prefix + b"steps", exchange.steps.encode()),
            (prefix + b"retries", str(exchange.retries).encode()),
            (b"x-compactgate-internal-rounds", str(exchange.internal_rounds).encode()),
        ]

    def record(self, exchange: Exchange) -> None:
        metrics = self.gw.metrics
        total = time.perf_counter() - exchange.started
        metrics.requests.labels(exchange.model, str(exchange.status)).inc()
        metrics.request_seconds.labels(exchange.model).observe(total)
        if exchange.upstream_seconds:
            metrics.upstream_seconds.labels(exchange.model).observe(exchange.upstream_seconds)
        metrics.overhead_seconds.labels(exchange.model).observe(
            max(0.0, total - exchange.upstream_seconds)
        )
        if exchange.tokens_before:
            metrics.tokens_before.labels(exchange.model).inc(exchange.tokens_before)
            metrics.tokens_after.labels(exchange.model).inc(exchange.tokens_after)
            if not exchange.observe and exchange.tokens_after < exchange.tokens_before:
                metrics.tokens_saved.labels(exchange.model).inc(
                    exchange.tokens_before - exchange.tokens_after
                )
            if not exchange.observe and exchange.steps != "none":
                for step in exchange.steps.split(","):
                    metrics.compactions.labels(step).inc()
        self.gw.events.count_request()
        if exchange.prepared is not None and (exchange.steps != "none" or exchange.retries):
            self.log_event(exchange, total)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "request_id=%s model=%s status=%d total_ms=%.2f upstream_ms=%.2f tokens_before=%d "
                "tokens_after=%d steps=%s retries=%d",
                exchange.request_id,
                exchange.model,
                exchange.status,
                total * 1000,
                exchange.upstream_seconds * 1000,
                exchange.tokens_before,
                exchange.tokens_after,
                exchange.steps,
                exchange.retries,
            )

    def log_event(self, exchange: Exchange, total: float) -> None:
        """One event-log line for a compacted or retried request (R5.3, 004 phases and reward)."""
        prepared = exchange.prepared
        assert prepared is not None
        chain = prepared.chain
        budget = prepared.budget
        changed = [s for s in prepared.steps if s.changed]
        recovery = chain.recovery if chain is not None else None
        success = 0 < exchange.status < 400
        phases = ["detection", *(s.type for s in changed)]
        phases += ["recovery"] if recovery else []
        phases += ["success"] if success else ["failure"]
        would_fail = bool(exchange.retries) or (
            budget is not None
            and prepared.tokens_before > budget.context_window - budget.reserved_output
        )
        self.gw.events.record(
            {
                "request_id": exchange.request_id,
                "model": exchange.model,
                "mode": "observe" if exchange.observe else "enforce",
                "status": exchange.status,
                "tokens_before": exchange.tokens_before,
                "tokens_after": exchange.tokens_after,
                "context_window": budget.context_window if budget else None,
                "budget": budget.limit if budget else None,
                "steps": [s.as_dict() for s in changed],
                "messages_removed": sum(s.messages_removed for s in changed),
                "summary_used": any(s.summary_used for s in changed),
                "recovery": recovery,
                "retries": exchange.retries,
                "context_errors": exchange.context_errors,
                "would_have_failed": would_fail,
                "phases": phases,
                "total_ms": round(total * 1000, 2),
                "reward": round(
                    reward(
                        success,
                        bool(recovery),
                        exchange.tokens_before,
                        exchange.tokens_after,
                        exchange.priority_preserved,
                        total * 1000,
                    ),
                    4,
                ),
            },
            content=prepared.messages,
        )


def _upstream_url(route: Route, path: str) -> str:
    base = route.upstream.base_url
    if base is None:
        raise NotFoundError(
            f"The model `{route.name}` has no OpenAI-compatible upstream for {path}."
        )
    return base + path


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


async def _first_chunk(response: UpstreamResponse) -> bytes:
    """The first body chunk of a stream (b'' if the stream is empty)."""
    async for chunk in response.chunks():
        if chunk:
            return chunk
    return b""


def _stream_context_error(first: bytes) -> ContextError | None:
    """A 200 stream that is empty, or opens with an error event, may be a context overflow."""
    if not first:
        # llama-cpp-python answers an overflowing streaming request with an empty 200 body.
        return ContextError(signature="empty_stream", limit=None, requested=None)
    head = first.lstrip()
    if not head.startswith(b"data:") or b'"error"' not in head[:4096]:
        return None
    event = head[5:].split(b"\n\n", 1)[0].strip()
    return classify(400, event)


# -- GET /v1/models, other /v1/* paths -------------------------------------------------------


async def list_models(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    identity = gw.authenticate(request.scope)
    routes = gw.router.routes()
    if routes:
        created = int(time.time())
        data = [
            {"id": r.name, "object": "model", "created": created, "owned_by": "compactgate"}
            for r in routes
            if identity.may_use(r.name)
        ]
        return JSONResponse({"object": "list", "data": data})
    return await passthrough(request)


async def _read_limited(gw: Gateway, request: Request) -> bytes | None:
    """The body under the size and time limits (413/408 raised); None if the client left."""
    server = gw.config.server
    try:
        return await read_body(
            request.receive, request.scope, server.max_body_bytes, server.body_read_timeout_s
        )
    except ClientDisconnected:
        return None


async def passthrough(request: Request) -> Response:
    """Any other /v1/* path, forwarded unchanged to the model's (or the default) upstream."""
    gw: Gateway = request.app.state.gateway
    identity = gw.authenticate(request.scope)
    body = await _read_limited(gw, request)
    if body is None:
        return Response(status_code=499)
    route = _route_for_passthrough(gw, body)
    gw.auth.authorize(identity, route.name)
    # The path only extends the configured base_url: no `..`, no other host (no SSRF).
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    url = _upstream_url(route, passthrough_path(raw_path))
    if request.url.query:
        url += "?" + request.url.query
    headers = forward_headers(
        request.scope["headers"], route.upstream.api_key, route.upstream.headers
    )
    with gw.limits.hold(identity.tenant):
        response = await gw.upstream.open(request.method, url, headers, body or None)
        try:
            data = await response.read()
        finally:
            response.release()
    return Response(
        data,
        status_code=response.status,
        headers=dict(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.relay_headers()
        ),
    )


def _route_for_passthrough(gw: Gateway, body: bytes) -> Route:
    model: Any = None
    if body[:1] == b"{":
        with contextlib.suppress(orjson.JSONDecodeError):
            parsed = orjson.loads(body)
            model = parsed.get("model") if isinstance(parsed, dict) else None
    if isinstance(model, str):
        route = gw.router.resolve(model)
        if route is not None and route.upstream.base_url:
            return route
    for route in gw.router.routes():
        if route.upstream.base_url:
            return route
    route = gw.router.resolve(model if isinstance(model, str) else "default")
    if route is None:
        raise NotFoundError("No upstream is configured for this path.")
    return route


# -- plan, health, metrics -------------------------------------------------------------------


async def plan(request: Request) -> Response:
    """POST /v1/compactgate/plan: the whole pipeline, no upstream chat call (R5.2)."""
    gw: Gateway = request.app.state.gateway
    identity = gw.authenticate(request.scope)
    body = await _read_limited(gw, request)
    if body is None:
        return Response(status_code=499)
    chat = parse_chat_request(body, gw.config.server.max_messages)
    gw.auth.authorize(identity, chat.model)
    route = gw.router.resolve(chat.model)
    if route is None:
        raise ModelNotFoundError(
            f"The model `{chat.model}` is not served by this gateway.", param="model"
        )
    prepared = await gw.pipeline.prepare(
        chat, route, gw.tenant(request.scope), window=gw.effective_window(route)
    )
    return JSONResponse(plan_report(prepared, gw.effective_window(route)))


def plan_report(prepared: Prepared, window: int | None) -> dict[str, Any]:
    budget = prepared.budget
    return {
        "model": prepared.route.name,
        "upstream_model": prepared.route.upstream_model,
        "tokenizer": prepared.route.tokenizer,
        "policy": prepared.route.policy_name,
        "context_window": window,
        "window_source": prepared.route.window_source,
        "reserved_output": budget.reserved_output if budget else None,
        "budget": budget.limit if budget else None,
        "trigger": budget.trigger if budget else None,
        "target": budget.target if budget else None,
        "tokens_before": prepared.tokens_before,
        "tokens_after": prepared.tokens_after,
        "fits": budget is None
        or prepared.tokens_after <= (budget.context_window - budget.reserved_output),
        "counts_by_role": dict(prepared.counts_by_role),
        "tokens_by_region": dict(prepared.tokens_by_region),
        "steps": [s.as_dict() for s in prepared.steps],
        "messages": prepared.messages,
    }


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    return JSONResponse({"status": "ready"})


async def metrics(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    return Response(gw.metrics.render(), media_type=gw.metrics.content_type)


# -- wiring ----------------------------------------------------------------------------------


async def _on_gateway_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, GatewayError)
    return Response(
        error.body(), status_code=error.status, media_type="application/json", headers=error.headers
    )


async def _on_http_error(request: Request, error: Exception) -> Response:
    status = getattr(error, "status_code", 404)
    message = "Not found." if status == 404 else str(getattr(error, "detail", "Bad request."))
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }
    return JSONResponse(body, status_code=status)


class _Dispatch:
    """The chat path skips Starlette's router; everything else goes through it."""

    def __init__(self, chat: ChatCompletions, app: Starlette, server: ServerConfig) -> None:
        self.chat = chat
        self.app = app
        self.state = app.state
        self.server = server
        self.gated = server.admin_port is not None or server.admin_token is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if self.gated and (refused := admin.refusal(scope, self.server)) is not None:
                await send_error(send, refused)
                return
            if scope["path"] == CHAT_PATH and scope["method"] == "POST":
                await self.chat(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(config: Config) -> _Dispatch:
    gateway = Gateway(config)
    app = Starlette(
        routes=[
            HttpRoute("/v1/models", list_models, methods=["GET"]),
            HttpRoute("/v1/compactgate/plan", plan, methods=["POST"]),
            HttpRoute("/healthz", healthz, methods=["GET"]),
            HttpRoute("/readyz", readyz, methods=["GET"]),
            HttpRoute("/metrics", metrics, methods=["GET"]),
            HttpRoute("/v1/compactgate/events", admin.events, methods=["GET"]),
            HttpRoute("/ui", admin.ui, methods=["GET"]),
            HttpRoute(
                "/v1/{path:path}", passthrough, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]
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
    return _Dispatch(ChatCompletions(gateway), app, config.server)


def create_app() -> _Dispatch:
    """App factory for `uvicorn --factory` / several workers: config from COMPACTGATE_CONFIG."""
    from .config import default_config, load_config

    path = os.environ.get("COMPACTGATE_CONFIG")
    return build_app(load_config(path) if path else default_config())
