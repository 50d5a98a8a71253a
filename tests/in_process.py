"""The in-process layer: the gateway's ASGI app and the fake upstream in the test's event loop.

Most of what the gateway does (parse, route, count, compact, forward, retry, relay, report) needs
no process of its own: the app `gateway.app.build_app(config)` is driven through httpx's
`ASGITransport`, with its lifespan run as a server would run it, and it forwards to the aiohttp
app of `tests/fake_upstream.py`, served in the same event loop and embedded in the gateway
(`upstream.provider: in_process`: `start_app` declares it for every upstream at a running fake
upstream's address whose provider the test does not name; HTTP/1.1 over a socket pair, no
port). A test then
costs milliseconds instead of the seconds a `compactgate serve` takes to start, and every test
gets a gateway of its own.

    async def test_something(start_app: AppStarter, local_upstream: LocalUpstream) -> None:
        gw = await start_app(
            {"models": [{"name": "m", "upstream": {"base_url": local_upstream.base_url}}]}
        )
        local_upstream.script([{"kind": "ok", "content": "hi"}])
        response = await gw.http.post(f"{gw.base_url}/chat/completions", json={...})
        reply = await gw.openai().chat.completions.create(model="m", messages=[...])
        [sent] = local_upstream.chat_requests()          # what the upstream received

`start_app(config, env=None)` loads `config` the way `compactgate serve --config` does (written
to a file, `${VAR}` from the environment plus `env`), starts the lifespan and returns an
`AppGateway`: `http` (an `httpx.AsyncClient` on the app), `openai(api_key=...)` (the official
SDK's `AsyncOpenAI` on the app), `url`/`base_url` (origin and `/v1`), `logs()` (what the
gateway logged, as a served process would print it). Everything stops when the test ends.

`local_upstream` answers like the fake upstream process and records what it receives; its
handle has the same methods as `tests.fake_upstream.FakeUpstream` (`script`, `configure`,
`requests`, `chat_requests`, `inflight`, `reset`), called directly rather than over HTTP, and
`await wait_idle()`. A second one for a test: `async with LocalUpstream.serve() as other:`.

What this layer cannot show, and the real-process tests (conftest's `start_gateway`, marked
`e2e`) do: responses are handed over whole, so no test here sees when a stream's chunks arrive
or hangs up halfway; no sockets reach the gateway (header and body deadlines, slow clients,
admin ports), no signals, no `--workers`, and no output of the CLI's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2  # the HTTP client the anthropic SDK is built on
import openai
import pytest
from aiohttp import web

from gateway.app import build_app
from gateway.asgi import Message
from gateway.config import load_config
from gateway.upstream import ServerFactory
from gateway.upstream.in_process import authority
from tests.fake_upstream import JSON, Config, State, make_app

ORIGIN = "http://gateway.localhost"  # never resolved: requests go to the app itself
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"  # what `serve` prints
# The running fake upstreams by `base_url`'s host:port: the servers every in-app gateway embeds.
# One that stops leaves it, so a gateway then finds nobody there, as over TCP.
LIVE: dict[str, ServerFactory] = {}


class LocalUpstream:
    """The fake upstream in the running event loop: an in-app gateway reaches it in-process
    (`upstream.provider: in_process`), anything else on its loopback port."""

    def __init__(self, state: State, port: int) -> None:
        self.state = state
        self.port = port
        self.root = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.root}/v1"

    @classmethod
    @contextlib.asynccontextmanager
    async def serve(cls) -> AsyncIterator[LocalUpstream]:
        state = State()
        runner = web.AppRunner(make_app(state), handler_cancellation=True, access_log=None)
        await runner.setup()
        name = ""
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            upstream = cls(state, int(runner.addresses[0][1]))
            name = authority(upstream.base_url)
            assert runner.server is not None
            LIVE[name] = runner.server
            yield upstream
        finally:
            LIVE.pop(name, None)
            state.reset()  # cancels hung handlers, so the cleanup does not wait on them
            await runner.cleanup()

    def requests(self) -> list[JSON]:
        """Every request received, oldest first (see tests/fake_upstream.py for the fields)."""
        return list(self.state.records)

    def chat_requests(self) -> list[JSON]:
        return [r for r in self.state.records if r["path"] == "/v1/chat/completions"]

    def reset(self) -> None:
        self.state.reset()

    def script(self, behaviours: list[JSON]) -> None:
        self.state.queue(behaviours)

    def configure(self, config: JSON) -> None:
        self.state.config = Config.parse(config)

    def inflight(self) -> JSON:
        return self.state.counters()

    async def wait_idle(self, timeout: float = 5.0) -> JSON:
        """Wait until no chat request is in flight (or `timeout`); returns the counters."""
        deadline = time.monotonic() + timeout
        while self.state.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.state.counters()


class AppGateway:
    """A gateway app running in this process, and clients on it."""

    def __init__(self, app: Any, config_path: Path, logs: io.StringIO) -> None:
        self.app = app
        self.config_path = config_path
        self.url = ORIGIN
        self.base_url = f"{ORIGIN}/v1"
        self.transport = httpx.ASGITransport(app=app)
        self.http = httpx.AsyncClient(transport=self.transport, base_url=ORIGIN, timeout=60)
        self._logs = logs
        self._sdk_clients: list[Any] = []
        # After start-up: objects frozen, objects a full collection walks, the young threshold.
        self.started_gc = (0, 0, 0)

    def openai(self, api_key: str = "sk-client", **options: Any) -> openai.AsyncOpenAI:
        """The official SDK on this gateway (no retries of its own); closed with the app."""
        client = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=api_key,
            max_retries=options.pop("max_retries", 0),
            timeout=options.pop("timeout", 60),
            http_client=httpx.AsyncClient(transport=self.transport),
            **options,
        )
        self._sdk_clients.append(client)
        return client

    def anthropic(self, api_key: str = "sk-client", **options: Any) -> anthropic.AsyncAnthropic:
        """The official anthropic SDK on this gateway (its base URL has no /v1, as Claude
        Code's `ANTHROPIC_BASE_URL`); closed with the app."""
        client = anthropic.AsyncAnthropic(
            base_url=self.url,
            api_key=api_key,
            max_retries=options.pop("max_retries", 0),
            timeout=options.pop("timeout", 60),
            http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=self.app)),
            **options,
        )
        self._sdk_clients.append(client)
        return client

    def logs(self) -> str:
        """Everything the gateway logged so far, debug level included."""
        return self._logs.getvalue()

    async def close(self) -> None:
        for client in self._sdk_clients:
            await client.close()
        await self.http.aclose()


@contextlib.asynccontextmanager
async def running_app(
    config: Mapping[str, Any],
    directory: Path,
    env: Mapping[str, str] | None = None,
    served_gc: bool = False,
) -> AsyncIterator[AppGateway]:
    """Build the app from `config` as `serve` would, run its lifespan, yield it, shut it down.

    Start-up ends with a full garbage collection (gateway/ops/memory.py). In a served process
    it walks the gateway's own objects; here it would walk the whole test process (pytest, the
    SDKs, every module any test imported), about half a second a start on a loaded machine.
    So the test process's objects are frozen first and start-up collects only what the app
    made; `served_gc=True` leaves them in, for the test of that collection itself."""
    path = directory / "gateway.json"
    path.write_text(json.dumps(in_process(config, LIVE)))
    app = build_app(load_config(path, {**os.environ, **(env or {})}), LIVE)
    thresholds = gc.get_threshold()
    with _captured_logs() as logs, _collected_normally(thresholds, served_gc):
        async with _lifespan(app):
            # The app freezes what start-up made and collects less often, to spare a serving
            # process long collections; the test process must keep collecting normally. What
            # the app left is noted first (`AppGateway.started_gc`).
            started_gc = (gc.get_freeze_count(), len(gc.get_objects()), gc.get_threshold()[0])
            gc.unfreeze()
            gc.set_threshold(*thresholds)
            gateway = AppGateway(app, path, logs)
            gateway.started_gc = started_gc
            try:
                yield gateway
            finally:
                await gateway.close()


def in_process(config: Mapping[str, Any], servers: Mapping[str, ServerFactory]) -> JSON:
    """`config` with every upstream at a running fake upstream's address declared in_process,
    unless it names its provider (a test of the HTTP transport says `provider: openai`)."""

    def declared(upstream: Any) -> Any:
        url = upstream.get("base_url") if isinstance(upstream, dict) else None
        if "provider" in upstream or not isinstance(url, str) or authority(url) not in servers:
            return upstream
        return {**upstream, "provider": "in_process"}

    models = []
    for model in config.get("models", []):
        model = dict(model)
        if isinstance(model.get("upstream"), dict):
            model["upstream"] = declared(model["upstream"])
        if isinstance(model.get("upstreams"), list):
            model["upstreams"] = [declared(u) for u in model["upstreams"]]
        models.append(model)
    return {**config, "models": models} if "models" in config else dict(config)


@contextlib.contextmanager
def _collected_normally(thresholds: tuple[int, int, int], served_gc: bool) -> Iterator[None]:
    """The test process's objects frozen for the app's start-up (unless `served_gc`); however
    start-up ends, nothing stays frozen and the thresholds are the test process's again."""
    if not served_gc:
        gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@contextlib.contextmanager
def _captured_logs() -> Any:
    logger = logging.getLogger("compactgate")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class LifespanError(RuntimeError):
    """The app's lifespan start-up or shutdown failed."""


@contextlib.asynccontextmanager
async def _lifespan(app: Any) -> AsyncIterator[None]:
    """The ASGI lifespan protocol, as uvicorn speaks it: start-up, serve, shutdown."""
    to_app: asyncio.Queue[Message] = asyncio.Queue()
    from_app: asyncio.Queue[Message] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
    task = asyncio.create_task(app(scope, to_app.get, from_app.put))

    async def step(request: str) -> None:
        await to_app.put({"type": f"lifespan.{request}"})
        answer = await _reply(from_app, task)
        if answer["type"] != f"lifespan.{request}.complete":
            raise LifespanError(f"lifespan {request}: {answer}")

    try:
        await step("startup")
        yield
        await step("shutdown")
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _reply(from_app: asyncio.Queue[Message], task: asyncio.Task[Any]) -> Message:
    getter = asyncio.ensure_future(from_app.get())
    await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
        return getter.result()
    getter.cancel()
    task.result()  # raises what the app raised
    raise LifespanError("the app returned during its lifespan")


AppStarter = Callable[..., Awaitable[AppGateway]]


@pytest.fixture
async def local_upstream() -> AsyncIterator[LocalUpstream]:
    """The fake upstream in this test's event loop (a fresh one per test)."""
    async with LocalUpstream.serve() as upstream:
        yield upstream


@pytest.fixture
async def start_app(tmp_path: Path) -> AsyncIterator[AppStarter]:
    """start_app(config, env=None, served_gc=False) -> AppGateway (see `running_app`); every app
    started is shut down after the test."""
    async with contextlib.AsyncExitStack() as stack:
        counter = iter(range(1000))

        async def start(
            config: Mapping[str, Any],
            env: Mapping[str, str] | None = None,
            served_gc: bool = False,
        ) -> AppGateway:
            directory = tmp_path / f"app-{next(counter)}"
            directory.mkdir()
            return await stack.enter_async_context(running_app(config, directory, env, served_gc))

        yield start
