"""The engine embedded in another program's event loop (design D19.6).

The rule this module owns: a program that forwards conversations itself (a LiteLLM proxy) gets
them compacted by the same entry point as every HTTP door, `Engine.prepare`, against the
model's window, tokenizer and policy, and, when its upstream still refused the result for its
context, compacted again from the client's original list against a tighter window (design
D6.2), never from what was already compacted.

    embedded = await Embedded.start(config, metrics)     # in the program's event loop
    done = await embedded.compact("m", messages, tenant, extra, info)
    ...the program sends done.messages; its upstream answers with a context error...
    again = await embedded.recompact(done.messages, error)   # None: not a list handed out here

Which model: a configured one (`COMPACTGATE_CONFIG`); with no models configured, any name with
the defaults, its window and output limit taken from what the program knows of the model
(`ModelInfo`, LiteLLM's model info) and else from the registry. A name the config does not
serve is left alone. Each list handed out is remembered (bounded, by the digest of its bytes)
with the request it was made from, so that a retry can start from the original.

Every conversation is counted in `compactgate_embedded_total{outcome}` and accounted like a
request of the HTTP doors (`api="litellm"` or the caller's name: metrics, the log line, the
event log); the program's answer is not seen here, so none is priced.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..app import Core, assemble_core
from ..config import Config
from ..engine.prepared import Prepared
from ..errors import GatewayError
from ..ops.logs import new_request_id
from ..ops.metrics import Metrics
from ..path.accounting import Accounting
from ..path.exchange import Exchange
from ..path.outcome import retry_window
from ..routing import Route
from ..wire import WireRequest
from ..wire.context_errors import ContextError
from ..wire.native import answer, native

REMEMBERED = 1024  # lists handed out, kept for a retry (the oldest forgotten first)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the embedding program knows of a model (used when no models are configured)."""

    model: str | None = None  # the provider's name for it (its tokenizer and registry entry)
    context_window: int | None = None
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Compacted:
    """The conversation to send instead, in the shape it came in."""

    messages: list[Any]
    system: Any  # the system prompt handed over with it (None when none was)
    changed: bool
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True, slots=True)
class _Made:
    """How a list handed out was made: enough to make it again, tighter."""

    request: WireRequest
    route: Route
    tenant: str
    prepared: Prepared
    attempts: int  # compactions of this conversation so far, the first included


class Embedded:
    """The core, and the conversations it handed out (module docstring)."""

    def __init__(self, core: Core, api: str = "litellm") -> None:
        self.core = core
        self.api = api
        self._books = Accounting(core.metrics, core.events, core.costs, core.calibration, api, True)
        self._made: OrderedDict[bytes, _Made] = OrderedDict()

    @classmethod
    async def start(cls, config: Config, metrics: Metrics, api: str = "litellm") -> Embedded:
        """The core assembled in the running loop (its store opened, its client started)."""
        return cls(await assemble_core(config, metrics=metrics), api)

    async def close(self) -> None:
        await self.core.close()

    def route(self, model: str, info: ModelInfo | None = None) -> Route | None:
        """The route of `model`; with no models configured, the defaults (module docstring)."""
        router = self.core.router
        route = router.resolve(model)
        if route is None and not self.core.config.models:
            info = info or ModelInfo()
            route = router.default_route(
                model,
                upstream_model=info.model,
                context_window=info.context_window,
                max_output_tokens=info.max_output_tokens,
            )
        return route

    async def compact(
        self,
        model: str,
        messages: list[Any],
        tenant: str,
        extra: Mapping[str, Any] | None = None,
        info: ModelInfo | None = None,
        api: str | None = None,
    ) -> Compacted | None:
        """`messages` as the engine would forward them for `model` (`extra`: the request's
        other fields that change the budget: tools, the output limit, the system prompt;
        `api`: the API they come from, when the messages do not say). None when the config
        does not serve `model`; 400-kind errors raise `GatewayError`."""
        route = self.route(model, info)
        if route is None:
            count(self.core.metrics, "unknown_model")
            return None
        request = native(model, messages, self.core.config.server.max_messages, extra, api)
        return await self._prepare(request, route, tenant, None, 1)

    async def recompact(self, sent: list[Any], error: ContextError) -> Compacted | None:
        """The conversation `sent` was made from, compacted again against a window tighter than
        what `error` (the upstream's refusal of `sent`) allows; None when `sent` is not a list
        this engine handed out."""
        made = self._made.get(digest(sent))
        if made is None:
            return None
        engine, request, route = self.core.engine, made.request, made.route
        tools = engine.tools_tokens(request, route)

        def limit_at(window: int) -> int:
            budget = engine.budget(request, route, tools, window)
            return budget.limit if budget is not None else window

        current = self.core.windows.effective(route)
        window = retry_window(current, made.prepared.settled(), error, limit_at)
        return await self._prepare(request, route, made.tenant, window, made.attempts + 1)

    async def _prepare(
        self, request: WireRequest, route: Route, tenant: str, window: int | None, attempt: int
    ) -> Compacted:
        core = self.core
        exchange = Exchange(request_id=new_request_id(), started=time.perf_counter(), api=self.api)
        exchange.tenant, exchange.requested = tenant, request.model
        exchange.model = core.metrics.model_label(route.name)
        retry = window is not None
        try:
            prepared = await core.engine.prepare(
                request,
                route,
                tenant,
                window=window if retry else core.windows.effective(route),
                force=retry,
                observe=route.mode == "observe" and not retry,
                headers=(),  # summaries with the route's own key, if it has one
                count_late=not retry,
                offer_expansion=False,  # the program forwards the messages alone
            )
        except GatewayError as error:
            exchange.failed(error)
            self._books.record(exchange)
            raise
        if prepared.stored:
            await core.tool_outputs.save(tenant, prepared.stored)
        exchange.status, exchange.retries = 200, attempt - 1
        self._books.note(exchange, prepared)
        self._books.record(exchange)
        messages, system = answer(request, prepared.body)
        # Changed: a chain's result or a held one (not a renamed body, not shadow mode).
        changed = not prepared.observe and (messages, system) != answer(request, request.body)
        if changed:
            self._remember(messages, request, route, tenant, prepared, attempt)
        count(core.metrics, ("recompacted" if retry else "compacted") if changed else "unchanged")
        return Compacted(messages, system, changed, prepared.tokens_before, prepared.tokens_after)

    def _remember(
        self,
        messages: list[Any],
        request: WireRequest,
        route: Route,
        tenant: str,
        prepared: Prepared,
        attempt: int,
    ) -> None:
        made = self._made
        made[digest(messages)] = _Made(request, route, tenant, prepared, attempt)
        while len(made) > REMEMBERED:
            made.popitem(last=False)


def count(metrics: Metrics, outcome: str) -> None:
    """One conversation's outcome, in `compactgate_embedded_total` (compacted, unchanged,
    recompacted, unknown_model, failed_open)."""
    metrics.child(metrics.embedded, outcome).inc()


def digest(messages: list[Any]) -> bytes:
    """A list's identity however the program copied it: the digest of its bytes."""
    try:
        return hashlib.sha256(orjson.dumps(messages)).digest()
    except (orjson.JSONEncodeError, TypeError):
        return b""
