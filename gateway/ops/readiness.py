"""What /readyz answers: can this replica serve requests?

Ready means the store answers (a Redis store is pinged; the memory store always answers) and
every configured model has at least one upstream that accepts a TCP connection. The upstream
check opens a connection to each distinct host and port and closes it: no request, no
credential, nothing billed, no TLS handshake. An upstream reached through litellm without a
`base_url` (a hosted provider) counts as reachable. `server.readiness_upstreams: false` leaves
upstreams out (a replica is then ready whatever its upstreams do).

Results are kept for `server.readiness_cache_s`, so probes from many places (kubelet, a load
balancer, a person) make one round of checks, and probes that arrive while a round runs share
it. The body names what is wrong without hosts or credentials (the endpoint is open to anyone
who can reach the port); the log line written when readiness changes names the hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..config import Config, UpstreamConfig
from ..store import SafeStore

log = logging.getLogger("compactgate.readiness")

MAX_CONNECT_S = 2.0  # under the usual probe timeout (3 s), whatever connect_timeout_s says

Address = tuple[str, int]


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
        self._timeout = min(config.server.connect_timeout_s, MAX_CONNECT_S)
        self._cached: Report | None = None
        self._until = 0.0
        self._running: asyncio.Future[Report] | None = None

    async def report(self) -> Report:
        """The latest round's report, or a new round's when it is older than the cache time."""
        if self._cached is not None and self._clock() < self._until:
            return self._cached
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._check())
        report = await asyncio.shield(self._running)  # a probe that hangs up ends no round
        if self._cached is None or report.ready != self._cached.ready:
            if report.ready:
                log.info("ready")
            else:
                log.warning("not ready: %s", "; ".join(report.details))
        self._cached = report
        self._until = self._clock() + self._config.server.readiness_cache_s
        return report

    async def _check(self) -> Report:
        store, upstreams = await asyncio.gather(self._check_store(), self._check_upstreams())
        found = [*store, *upstreams]
        return Report(
            not found, tuple(reason for reason, _ in found), tuple(detail for _, detail in found)
        )

    async def _check_store(self) -> list[tuple[str, str]]:
        problem = await self._store.ping()
        if problem is None:
            return []
        kind = problem.partition(":")[0]
        return [(f"store: not answering ({kind})", f"store: {problem}")]

    async def _check_upstreams(self) -> list[tuple[str, str]]:
        if not self._config.server.readiness_upstreams:
            return []
        models = self._config.models
        addresses = sorted({a for m in models for u in m.targets if (a := _address(u))})
        outcomes = await asyncio.gather(*(self._reach(a) for a in addresses))
        failed = {a: why for a, why in zip(addresses, outcomes, strict=True) if why is not None}
        found = []
        for model in models:
            reached = [_address(u) for u in model.targets]
            if any(a is None or a not in failed for a in reached):
                continue
            whys = sorted({failed[a] for a in reached if a is not None})
            hosts = ", ".join(f"{a[0]}:{a[1]} {failed[a]}" for a in reached if a is not None)
            count = len(reached)
            found.append(
                (
                    f"model {model.name}: none of its {count} upstream(s) accepts connections "
                    f"({', '.join(whys)})",
                    f"model {model.name}: no upstream reachable ({hosts})",
                )
            )
        return found

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
    if upstream.base_url is None:
        return None
    parts = urlsplit(upstream.base_url)
    if parts.hostname is None:
        return None
    default = 443 if parts.scheme == "https" else 80
    try:
        return parts.hostname, parts.port or default
    except ValueError:
        return None
