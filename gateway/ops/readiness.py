"""What /readyz answers: can this replica serve requests?

The rule this module owns (design D17.5): ready means this replica itself can serve. It is not
ready while it drains (the server is shutting down: SIGTERM received, or the lifespan ending)
or while a store the config needs (a shared Redis store; the memory store always answers) does
not answer a ping. Nothing outside the replica decides it: an upstream that does not answer is
the same upstream behind every replica, and a readiness that followed it would take every
replica out of the load balancer's pool together, with the models whose upstreams do answer.
Upstream reachability is detail (`ops.upstream_health`: `/healthz`, the overview, a gauge).

Results are kept for `server.readiness_cache_s`, so probes from many places (kubelet, a load
balancer, a person) make one store ping, and probes that arrive while one runs share it; a
drain is seen at once. The body names what is wrong without hosts or credentials (the endpoint
is open to anyone who can reach the port); the log line written when readiness changes names
the store's problem in full.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ..config import Config
from ..store import SafeStore

log = logging.getLogger("compactgate.readiness")

DRAINING = "draining: the server is shutting down"


@dataclass(frozen=True, slots=True)
class Report:
    ready: bool
    reasons: tuple[str, ...] = ()  # for the body: no hosts
    details: tuple[str, ...] = ()  # for the log: with hosts

    def body(self) -> dict[str, Any]:
        if self.ready:
            return {"status": "ready"}
        return {"status": "not ready", "reasons": list(self.reasons)}


class Readiness:
    def __init__(
        self, config: Config, store: SafeStore, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._shared = config.store.startswith(("redis", "rediss"))  # a store the config needs
        self._cached: Report | None = None
        self._until = 0.0
        self._running: asyncio.Future[Report] | None = None
        self.draining = False

    def drain(self) -> None:
        """From now on this replica is not ready (it is shutting down)."""
        if not self.draining:
            self.draining = True
            log.info("not ready: %s", DRAINING)

    async def report(self) -> Report:
        """Not ready while draining; else the latest store check, or a new one when it is older
        than the cache time."""
        if self.draining:
            return Report(False, (DRAINING,), (DRAINING,))
        if self._cached is not None and self._clock() < self._until:
            return self._cached
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._check())
        report = await asyncio.shield(self._running)  # a probe that hangs up ends no check
        if self._cached is None or report.ready != self._cached.ready:
            if report.ready:
                log.info("ready")
            else:
                log.warning("not ready: %s", "; ".join(report.details))
        self._cached = report
        self._until = self._clock() + self._config.server.readiness_cache_s
        return report

    async def _check(self) -> Report:
        if not self._shared:
            return Report(True)
        problem = await self._store.ping()
        if problem is None:
            return Report(True)
        kind = problem.partition(":")[0]
        return Report(False, (f"store: not answering ({kind})",), (f"store: {problem}",))


def drain_on_termination(readiness: Readiness) -> Callable[[], None]:
    """Under `serve`, a SIGTERM marks `readiness` draining before uvicorn's own handler begins
    the shutdown; returns the undo. Only the main thread may set handlers, and only uvicorn's
    (a bound method of its `Server`) is chained: elsewhere (a test's event loop) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    owner = getattr(previous, "__self__", None)
    if not callable(previous) or type(owner).__module__ != "uvicorn.server":
        return lambda: None

    def handler(number: int, frame: FrameType | None) -> None:
        readiness.drain()
        previous(number, frame)

    signal.signal(signal.SIGTERM, handler)

    def undo() -> None:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, previous)

    return undo
