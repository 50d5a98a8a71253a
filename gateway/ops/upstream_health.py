"""Which models' upstreams accept connections: detail for people and dashboards, never readiness.

The rule this module owns (design D17.5): upstream reachability is reported, per model, in the
`/healthz` body, the overview (`/v1/compactgate/overview`) and the gauge
`compactgate_upstream_reachable{model}`, and nowhere decides whether this replica is ready. One
dead upstream behind every replica must not take every replica out of a load balancer's pool:
the models whose upstreams answer would go down with it (`readiness` owns what does decide).

A round of checks opens a TCP connection to each distinct host and port of the configured
upstreams and closes it: no request, no credential, nothing billed, no TLS handshake. An
upstream reached through litellm without a `base_url` (a hosted provider), or served in this
process (`in_process`), counts as reachable.
A model is reachable when any of its upstreams is. Rounds run when asked for and at most once
per `server.readiness_cache_s`; a probe never waits long for one (`report(wait)`), since a
liveness probe that times out restarts a healthy process. `server.readiness_upstreams: false`
turns the checks off. Hosts appear only in the log, when a model's reachability changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Gauge

from ..config import Config, UpstreamConfig

log = logging.getLogger("compactgate.upstreams")

MAX_CONNECT_S = 2.0  # a round's connection attempts, whatever connect_timeout_s says

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ModelReach:
    """One model's upstreams in the latest round."""

    reachable: bool
    upstreams: int  # how many it has
    down: tuple[str, ...] = ()  # why the ones that failed did (no hosts: an open endpoint)

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = {"reachable": self.reachable, "upstreams": self.upstreams}
        if self.down:
            view["down"] = list(self.down)
        return view


@dataclass(frozen=True, slots=True)
class Round:
    models: Mapping[str, ModelReach]
    at: float  # time.time() of the round

    def view(self) -> dict[str, Any]:
        return {
            "checked_at": round(self.at, 3),
            "models": {name: reach.view() for name, reach in self.models.items()},
        }


class UpstreamHealth:
    def __init__(
        self,
        config: Config,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._clock = clock
        self._timeout = min(config.server.connect_timeout_s, MAX_CONNECT_S)
        self._latest: Round | None = None
        self._until = 0.0
        self._running: asyncio.Task[Round] | None = None
        self.enabled = config.server.readiness_upstreams
        self.gauge = Gauge(
            "compactgate_upstream_reachable",
            "1 while at least one of the model's upstreams accepts TCP connections (checked "
            "when probed, at most every server.readiness_cache_s), 0 otherwise",
            ["model"],
            registry=registry,
            multiprocess_mode="livemax",
        )

    async def report(self, wait: float) -> Round | None:
        """The latest round, refreshed when it is older than the cache time; waits at most
        `wait` seconds for a round under way (None: none has finished yet, or checks are off)."""
        if not self.enabled:
            return None
        if self._latest is None or self._clock() >= self._until:
            if self._running is None or self._running.done():
                self._running = asyncio.create_task(self._round())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._running), wait)
        return self._latest

    async def close(self) -> None:
        if self._running is not None and not self._running.done():
            self._running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._running

    async def _round(self) -> Round:
        models = self._config.models
        addresses = sorted({a for m in models for u in m.targets if (a := _address(u))})
        outcomes = await asyncio.gather(*(self._reach(a) for a in addresses))
        failed = {a: why for a, why in zip(addresses, outcomes, strict=True) if why is not None}
        reaches: dict[str, ModelReach] = {}
        for model in models:
            targets = [_address(u) for u in model.targets]
            down = sorted({failed[a] for a in targets if a is not None and a in failed})
            reachable = any(a is None or a not in failed for a in targets)
            reaches[model.name] = ModelReach(reachable, len(targets), tuple(down))
            self.gauge.labels(model.name).set(1 if reachable else 0)
            previous = self._latest.models.get(model.name) if self._latest else None
            if previous is None or previous.reachable != reachable:
                hosts = ", ".join(f"{a[0]}:{a[1]} {failed[a]}" for a in targets if a in failed)
                if reachable:
                    log.info("model %s: an upstream accepts connections", model.name)
                else:
                    log.warning("model %s: no upstream accepts connections (%s)", model.name, hosts)
        result = Round(reaches, time.time())
        self._latest = result
        self._until = self._clock() + self._config.server.readiness_cache_s
        return result

    async def _reach(self, address: Address) -> str | None:
        """None if `address` accepts a TCP connection, else why not, in a few words."""
        try:
            async with asyncio.timeout(self._timeout):
                _, writer = await asyncio.open_connection(*address)
        except TimeoutError:
            return "connect timed out"
        except OSError as error:  # errno's text: asyncio's own message repeats the address
            return os.strerror(error.errno).lower() if error.errno else "connect failed"
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None


def _address(upstream: UpstreamConfig) -> Address | None:
    """Where to connect to check `upstream`; None for one that is not reached over TCP."""
    if upstream.base_url is None or upstream.provider == "in_process":
        return None
    parts = urlsplit(upstream.base_url)
    if parts.hostname is None:
        return None
    default = 443 if parts.scheme == "https" else 80
    try:
        return parts.hostname, parts.port or default
    except ValueError:
        return None
