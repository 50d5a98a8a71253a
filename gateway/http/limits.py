"""Per-tenant concurrency: at most `server.max_concurrent_per_tenant` requests in flight.

The rule this module owns: a tenant's slot is taken before its first upstream call and given back
exactly once when its response ends, however it ends (finished, failed, client gone, task
cancelled at shutdown). Beyond the limit the request is refused at once with 429 and a
`Retry-After` header, before anything is sent upstream; it never queues, so one tenant's burst
cannot hold memory or sockets on behalf of the others.

The counts live in this process (one event loop, so no lock is needed); with several uvicorn
workers the limit applies per worker. A tenant with nothing in flight has no entry, so the table
is bounded by the number of requests being served.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from prometheus_client import CollectorRegistry, Gauge

from ..errors import TooManyRequestsError

RETRY_AFTER_SECONDS = 1


class ConcurrencyLimits:
    """Counts in-flight requests per tenant; `hold(tenant)` takes a slot for a block."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._active: dict[str, int] = {}

    def active(self, tenant: str) -> int:
        return self._active.get(tenant, 0)

    @property
    def tenants(self) -> int:
        """How many tenants have a request in flight."""
        return len(self._active)

    def hold(self, tenant: str) -> contextlib.AbstractContextManager[None]:
        """A slot for the duration of the block; TooManyRequestsError (429) on entering it when
        none is free. Without a limit, a context manager that does nothing (one for all)."""
        return _UNLIMITED if self.limit is None else _Slot(self, tenant)

    def _take(self, tenant: str, limit: int) -> None:
        count = self._active.get(tenant, 0)
        if count >= limit:
            raise TooManyRequestsError(
                f"Too many concurrent requests for this API key: the limit is {limit}. "
                "Retry when one of them has finished.",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        self._active[tenant] = count + 1

    def _give_back(self, tenant: str) -> None:
        remaining = self._active[tenant] - 1
        if remaining:
            self._active[tenant] = remaining
        else:
            del self._active[tenant]


_UNLIMITED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class _Slot:
    """One request's slot: taken on entering the block, given back once on leaving it."""

    __slots__ = ("_limits", "_tenant")

    def __init__(self, limits: ConcurrencyLimits, tenant: str) -> None:
        self._limits = limits
        self._tenant = tenant

    def __enter__(self) -> None:
        limit = self._limits.limit
        assert limit is not None  # `hold` makes a slot only under a limit
        self._limits._take(self._tenant, limit)

    def __exit__(self, *_: object) -> None:
        self._limits._give_back(self._tenant)


def register_gauges(registry: CollectorRegistry, limits: ConcurrencyLimits) -> None:
    """Leak detectors, read at scrape time: asyncio tasks alive in this worker and the blocks
    CPython has allocated (both back to their idle baseline when nothing is in flight; RSS alone
    cannot say, as the allocator keeps freed memory), and tenants holding a slot. No tenant is
    ever a label."""
    Gauge(
        "compactgate_asyncio_tasks", "asyncio tasks alive in this worker", registry=registry
    ).set_function(_tasks_alive)
    Gauge(
        "compactgate_python_allocated_blocks",
        "Memory blocks CPython has allocated (live objects)",
        registry=registry,
    ).set_function(sys.getallocatedblocks)
    Gauge(
        "compactgate_tenants_in_flight",
        "Tenants with a request in flight (concurrency limit)",
        registry=registry,
    ).set_function(lambda: limits.tenants)


def _tasks_alive() -> int:
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # no running loop (scraped from another thread)
        return 0
