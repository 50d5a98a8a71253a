"""The composition root: `build_app(config)` is the gateway as an ASGI app.

Nothing here serves a request. At start-up (the ASGI lifespan) `assemble` builds the gateway's
parts from the bottom up, each given only what it uses, every part frozen once built and none
handed to another before it is complete: first what stands alone (metrics, the store, the
models, the upstream client), then the shared secret of references (resolved before anything
that signs with it), then the engine (`engine.Engine`: counting, the policy chain, rendering)
and what stands on it (summaries made ahead of need, agents' compaction, the forwarder), then
the HTTP doors (`http.endpoints` for the compacting APIs, the other handlers, `http.dispatch`).
At shutdown the parts that hold work or connections are closed in the reverse order.

    request -> http.dispatch -> http.endpoints.Endpoint   (one per wire API)
                                  agents.hooks             (an agent's compaction answered?)
                                  engine.Engine.prepare  (what to forward)
                                  path.forward.Forwarder   (send, relay, retry on overflow)
                                  path.accounting          (headers, metrics, logs, events)

`create_app` is the factory `compactgate serve --workers N` gives uvicorn (config from
COMPACTGATE_CONFIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.routing import Route as HttpRoute

from .agents.answers import CompactionAnswers
from .agents.context_management import ContextManagement
from .agents.hooks import AgentHooks
from .agents.remote import RemoteCompaction
from .asgi import Message, Receive, Scope, Send
from .config import Config, ConfigError
from .counting.runner import Counting
from .engine.engine import Engine
from .engine.shared_held import SharedEvents
from .expansion import Expansion
from .http.admin import AdminViews
from .http.auth import Authenticator
from .http.compress import CompressEndpoint
from .http.cors import Origins
from .http.dispatch import Dispatch, logged
from .http.endpoints import CountTokens, Doorway, Endpoint, MessagesEndpoint, Serving
from .http.hosts import Hosts
from .http.limits import ConcurrencyLimits, register_gauges
from .http.models import Models
from .http.passthrough import Passthrough
from .http.plan import Plan
from .http.probes import Probes
from .http.responses import CompactEndpoint, ResponsesEndpoint
from .http.socket import ResponsesSocket
from .ops.costs import Accountant, OwnSpend, price_map
from .ops.events import EventLog
from .ops.memory import freeze_startup_objects
from .ops.metrics import Metrics
from .ops.readiness import Readiness, drain_on_termination
from .ops.upstream_health import UpstreamHealth
from .path.accounting import Accounting
from .path.calibration import Calibration
from .path.forward import Forwarder
from .path.own_calls import OwnCalls
from .path.windows import Windows
from .routing import Router
from .store import SafeStore, open_store, signing_key
from .summaries import Precompute, Summarizer, SummaryService
from .tool_outputs import ToolOutputCache
from .upstream import ServerFactory, UpstreamClient
from .upstream.counts import UpstreamCounts
from .upstream.failover import Balancer
from .upstream.in_process import unserved
from .upstream.retry import Sender
from .wire import COUNT_TOKENS, MESSAGES, RESPONSES
from .wire.chat import ChatWire
from .wire.resent import ResentMessages
from .wire.validated import ValidatedMessages


@dataclass(frozen=True, slots=True)
class Core:
    """The engine and what it stands on: everything a request needs besides the HTTP doors
    (what `/v1/compactgate/plan`, `compactgate plan` and the tests drive without them)."""

    config: Config
    metrics: Metrics
    store: SafeStore
    router: Router
    windows: Windows
    upstream: UpstreamClient
    sender: Sender
    events: EventLog
    costs: Accountant
    spend: OwnSpend  # the gateway's own calls, priced
    calibration: Calibration
    tool_outputs: ToolOutputCache
    summaries: SummaryService
    counting: Counting
    engine: Engine
    precompute: Precompute  # the summaries a conversation will need, made ahead of need
    readiness: Readiness  # can this replica serve (draining, its store)
    upstream_health: UpstreamHealth  # which models' upstreams accept connections

    async def close(self) -> None:
        """Shutdown, in the reverse order of building: upstream checks stopped, background
        summaries and counts cancelled, then the store and the upstream client closed, then the
        event log."""
        await self.upstream_health.close()
        await self.summaries.close()
        await self.counting.close()
        await self.store.close()
        await self.upstream.close()
        self.events.close()


async def assemble_core(
    config: Config,
    in_process: Mapping[str, ServerFactory] | None = None,
    metrics: Metrics | None = None,
) -> Core:
    """The core, ready to serve: its store opened, the references' key resolved before
    anything that signs with it is built, the upstream client started. Runs in the event loop
    that will serve: the upstream client and the store connect from it. `metrics`: an
    embedding program's own (`integrations`), else new."""
    metrics = metrics if metrics is not None else Metrics()
    store = open_store(config.store, metrics, check_s=config.store_sync_s)
    secret = (await signing_key(config.tool_outputs.ref_secret, config.store, store, metrics)).value
    core = build_core(config, in_process, secret=secret, metrics=metrics, store=store)
    await core.upstream.start()  # and litellm imported now, if a model uses it
    return core


def build_core(
    config: Config,
    in_process: Mapping[str, ServerFactory] | None = None,
    *,
    secret: bytes,
    metrics: Metrics | None = None,
    store: SafeStore | None = None,
) -> Core:
    """The core built from the bottom up (module docstring), nothing started: the engine as a
    library (benchmarks, tests, an embedding program) when nothing is sent upstream, or the
    core `assemble_core` then starts."""
    metrics = metrics if metrics is not None else Metrics()
    store = (
        store
        if store is not None
        else open_store(config.store, metrics, check_s=config.store_sync_s)
    )
    router = Router(config)
    windows = Windows(metrics, store)
    upstream = UpstreamClient(config.server, config.providers, in_process)
    sender = Sender(upstream, metrics, Balancer())
    events = EventLog(config.events)
    costs = Accountant(metrics)
    spend = OwnSpend(costs, events)
    tool_outputs = ToolOutputCache(store, config.tool_outputs)
    summarizer = Summarizer(
        sender, router, metrics, config.summaries, windows.effective, on_usage=spend
    )
    summaries = SummaryService(config.summaries, store, summarizer, metrics)
    counting = Counting(store if store.shared else None, threads=config.server.count_threads)
    upstream_counts = UpstreamCounts(upstream)
    engine = Engine(
        metrics,
        summaries,
        safety_margin=config.server.safety_margin_tokens,
        clamp_max_tokens=config.server.clamp_max_tokens,
        ref_secret=secret,
        inject_stream_usage=config.server.stream_usage == "inject",
        tool_outputs=tool_outputs,
        count_remote=upstream_counts.count_for,
        counting=counting,
        shared=SharedEvents(store) if store.shared else None,
    )
    return Core(
        config=config,
        metrics=metrics,
        store=store,
        router=router,
        windows=windows,
        upstream=upstream,
        sender=sender,
        events=events,
        costs=costs,
        spend=spend,
        calibration=Calibration(metrics, store),
        tool_outputs=tool_outputs,
        summaries=summaries,
        counting=counting,
        engine=engine,
        precompute=Precompute(summaries, engine),
        readiness=Readiness(config, store),
        upstream_health=UpstreamHealth(config, metrics.registry),
    )


def doors(core: Core) -> Dispatch:
    """The HTTP side of a built core: the compacting endpoints and every other handler."""
    server = core.config.server
    auth = Authenticator(core.config)
    limits = ConcurrencyLimits(server.max_concurrent_per_tenant)
    register_gauges(core.metrics.registry, limits)
    door = Doorway(
        auth, core.router, limits, core.metrics, server, ResentMessages(report=core.metrics)
    )
    endpoints = compacting(core, door)
    responses = endpoints["/v1/responses"]
    origins = Origins(server.cors_origins, Hosts(server.allowed_hosts))
    socket = ResponsesSocket(auth, responses, server, core.metrics.registry, origins)  # Codex's
    routes = [WebSocketRoute("/v1/responses", socket.session), *others(core, door)]
    return Dispatch(endpoints, routes, server, origins)


def compacting(core: Core, door: Doorway) -> dict[str, Endpoint]:
    """The compacting endpoints by path, and what their agents' hooks and forwarding use."""
    config, metrics, engine = core.config, core.metrics, core.engine
    server = config.server
    own_calls = OwnCalls(engine, core.sender, core.windows, core.spend, server.max_messages)
    answers = CompactionAnswers(
        core.store, core.summaries.spawn, own_calls.complete, metrics, config.summaries
    )
    remote = RemoteCompaction(
        core.store, core.summaries, engine.ref_secret, engine.counts, answers, config.summaries
    )
    hooks = AgentHooks(
        config.agent_compaction.signatures,
        answers,
        core.precompute,
        engine.counts,
        engine.tools_tokens,
        core.windows,
        metrics,
    )
    expansion = Expansion(core.tool_outputs, core.upstream, metrics)
    forwarder = Forwarder(core.sender, engine, expansion, core.tool_outputs, core.windows, metrics)
    serving = Serving(engine, forwarder, hooks, core.windows)
    context_management = ContextManagement(
        remote.summarise, engine.counts, engine.tools_tokens, server.max_messages
    )

    def books(api: str, saves: bool = True) -> Accounting:
        return Accounting(metrics, core.events, core.costs, core.calibration, api, saves)

    sender = core.sender
    return {
        "/v1/chat/completions": Endpoint(
            door, serving, ChatWire(ValidatedMessages()), books("chat")
        ),
        "/v1/responses": ResponsesEndpoint(
            door, serving, RESPONSES, books("responses"), remote, sender
        ),
        "/v1/responses/compact": CompactEndpoint(
            door, serving, RESPONSES, books("responses"), remote, sender
        ),
        "/v1/messages": MessagesEndpoint(
            door, serving, MESSAGES, books("messages"), context_management
        ),
        # A count is not a generation: it saves nothing.
        "/v1/messages/count_tokens": CountTokens(
            door, serving, COUNT_TOKENS, books("count_tokens", saves=False), sender
        ),
        # Another gateway's compressor: the engine's answer, nothing sent upstream.
        "/v1/compress": CompressEndpoint(
            door, serving, books("compress"), core.tool_outputs, defaults=not config.models
        ),
    }


def others(core: Core, door: Doorway) -> list[BaseRoute]:
    """Every other handler, through Starlette's router: models, plan, probes, the admin feeds
    and page, and passthrough of the other /v1/* paths."""
    metrics, server, auth = core.metrics, core.config.server, door.auth
    passthrough = Passthrough(auth, core.router, door.limits, core.sender, metrics, server)
    models = Models(passthrough, core.windows, metrics)
    probes = Probes(core.readiness, core.upstream_health, metrics)
    admin = AdminViews(core.events, metrics, core.router, core.windows, core.upstream_health)
    plan = Plan(auth, core.router, core.engine, core.windows, server)
    return [
        HttpRoute("/v1/models", logged(metrics, "models", models.list_models), methods=["GET"]),
        HttpRoute(
            "/v1/models/{model_id:path}",
            logged(metrics, "models", models.get_model),
            methods=["GET"],
        ),
        HttpRoute("/v1/compactgate/plan", plan.handle, methods=["POST"]),
        HttpRoute("/healthz", probes.healthz, methods=["GET"]),
        HttpRoute("/readyz", probes.readyz, methods=["GET"]),
        HttpRoute("/metrics", probes.metrics, methods=["GET"]),
        HttpRoute("/v1/compactgate/events", admin.events, methods=["GET"]),
        HttpRoute("/v1/compactgate/overview", admin.overview, methods=["GET"]),
        HttpRoute("/ui", admin.ui, methods=["GET"]),
        HttpRoute(
            "/v1/{path:path}",
            logged(metrics, "passthrough", passthrough),
            methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
        ),
    ]


class GatewayApp:
    """The ASGI app: its lifespan assembles the gateway (`assemble_core`, `doors`) and closes
    it; every other scope is dispatched to the doors."""

    def __init__(
        self, config: Config, in_process: Mapping[str, ServerFactory] | None = None
    ) -> None:
        self.config = config
        self._in_process = in_process
        self.core: Core | None = None  # set while the app is serving
        self._doors: Dispatch | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[Core]:
        """Assemble, serve, close (the ASGI lifespan, usable directly by code that runs the app
        in a server of its own)."""
        core = await assemble_core(self.config, self._in_process)
        try:
            self._doors = doors(core)
            # The price map (litellm's, about half a second to read) is read now rather than
            # by the first answered request, and frozen with the rest of start-up.
            await asyncio.to_thread(price_map)
            self.core = core
            freeze_startup_objects()  # last: everything start-up made stays out of collections
            undo = drain_on_termination(core.readiness)  # SIGTERM: not ready from then on
            try:
                yield core
            finally:
                core.readiness.drain()
                undo()
        finally:
            self.core, self._doors = None, None
            await core.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        doors = self._doors
        if doors is None:
            raise RuntimeError(
                "the gateway app serves only between its lifespan's start-up and shutdown"
            )
        await doors(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """The ASGI lifespan protocol around `lifespan`."""
        started: Message = await receive()
        assert started["type"] == "lifespan.startup"
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(self.lifespan())
            except BaseException as error:
                await send({"type": "lifespan.startup.failed", "message": repr(error)})
                raise
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            try:
                await stack.aclose()
            except BaseException as error:
                await send({"type": "lifespan.shutdown.failed", "message": repr(error)})
                raise
        await send({"type": "lifespan.shutdown.complete"})


def build_app(config: Config, in_process: Mapping[str, ServerFactory] | None = None) -> GatewayApp:
    """The ASGI app for `config`. `in_process`: servers embedded with the gateway, by the name
    their upstreams' base_url gives (`upstream.provider: in_process`)."""
    problems = unserved(config, in_process or {})
    if problems:
        raise ConfigError(problems)
    return GatewayApp(config, in_process)


def create_app() -> GatewayApp:
    """App factory for `uvicorn --factory` / several workers: config from COMPACTGATE_CONFIG."""
    from .config import default_config, load_config

    path = os.environ.get("COMPACTGATE_CONFIG")
    return build_app(load_config(path) if path else default_config())
