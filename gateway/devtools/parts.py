"""The gateway's parts built on their own: for tests of one seam at a time and for benchmarks
that measure the engine without HTTP.

`parts(config)` is the core the composition root builds (`gateway.app.build_core`: the models,
the engine, the learnt windows, the summaries and their precomputation, over the config's store,
nothing started), plus the parse memos an endpoint keeps. No HTTP door, no upstream connection,
no app.

Every `Parts` signs references with the same fixed key, so two of them (one remembering, one
from scratch) make the same refs for the same outputs, as replicas sharing a store do.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..app import Core, build_core
from ..config import Config
from ..routing import Route
from ..wire import Wire, WireRequest
from ..wire.resent import ResentMessages

SECRET = b"standalone parts: the refs' key."


@dataclass
class Parts:
    core: Core
    resent: ResentMessages

    def __getattr__(self, name: str) -> object:
        return getattr(self.core, name)  # router, engine, windows, summaries, precompute, ...

    def parse(self, wire: Wire, body: bytes, tenant: str) -> WireRequest:
        """`body` parsed as the endpoint parses it, resuming the tenant's previous parse."""
        config = self.core.config
        return wire.parse(body, config.server.max_messages, self.resent.scope(tenant))

    def route(self, name: str) -> Route:
        route = self.core.router.resolve(name)
        assert route is not None, name
        return route

    def effective_window(self, route: Route) -> int | None:
        return self.core.windows.effective(route)


def parts(config: Config) -> Parts:
    """The parts of a gateway for `config` (module docstring). Summaries would be asked of the
    models' upstreams, which no test here starts: a test that needs them replaces
    `summaries.summarizer` with a stub."""
    return Parts(build_core(config, secret=SECRET), ResentMessages())
