"""Upstream retry and failover (design D11.3, D11.4): 429, 5xx and connection failures.

Retried with exponential backoff and full jitter, honouring `Retry-After` (seconds or an HTTP
date), bounded by the route's `max_attempts` and `max_delay_seconds`. Only failures that come
before any byte of a response reached the client are retried: this runs before relaying starts.
Timeouts are not retried (the client has already waited the whole timeout).

A model with several upstreams fails over: the next upstream (in the `failover.Balancer`'s
order) is tried at once, without waiting; the backoff comes only once every upstream has failed
in this request. Each upstream is tried at least once, whatever `max_attempts` says.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Mapping, Sequence

from ..errors import UpstreamUnreachableError
from ..ops.metrics import Metrics
from ..routing import Route
from . import UpstreamClient, UpstreamResponse
from .failover import Balancer, Destination

log = logging.getLogger("compactgate.upstream")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_REST_SECONDS = 3600.0  # a Retry-After beyond an hour is not believed


class Sender:
    """What every part that calls an upstream uses: the client, the metrics that count retries
    and failovers, and the balancer that orders a model's upstreams (one per process)."""

    def __init__(self, client: UpstreamClient, metrics: Metrics, balancer: Balancer) -> None:
        self.client = client
        self.metrics = metrics
        self.balancer = balancer

    async def send(
        self,
        route: Route,
        destinations: Sequence[Destination],
        body: bytes | None,
        method: str = "POST",
        retry: bool = True,
    ) -> tuple[UpstreamResponse, Destination]:
        """`send_balanced` with this process's client, metrics and balancer."""
        return await send_balanced(
            self.client, route, destinations, body, self.metrics, self.balancer, method, retry
        )


async def send_with_retries(
    client: UpstreamClient,
    route: Route,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    metrics: Metrics,
) -> UpstreamResponse:
    """One upstream, retried (the rounds of a request already answered by that upstream)."""
    only = Destination(route.upstream, url, headers)
    response, _ = await send_balanced(client, route, [only], body, metrics)
    return response


async def send_balanced(
    client: UpstreamClient,
    route: Route,
    destinations: Sequence[Destination],
    body: bytes | None,
    metrics: Metrics,
    balancer: Balancer | None = None,
    method: str = "POST",
    retry: bool = True,
) -> tuple[UpstreamResponse, Destination]:
    """Send to the best of `destinations`, failing over and retrying; returns the response and
    the destination that gave it (later rounds of the same answer go there). `retry=False`:
    each destination is tried once, none twice (paths that are not ours to repeat)."""
    policy = route.retry
    several = balancer if balancer is not None and len(destinations) > 1 else None
    order = (
        several.order([d.upstream for d in destinations])
        if several is not None
        else list(range(len(destinations)))
    )
    count = len(order)
    attempts = max(policy.max_attempts if retry else 1, count)
    for attempt in range(1, attempts + 1):
        destination = destinations[order[(attempt - 1) % count]]
        last = attempt == attempts
        delay: float | None = None
        rest = policy.cooldown_seconds
        try:
            response = await client.open(
                method, destination.url, destination.headers, body, destination.provider
            )
        except UpstreamUnreachableError:
            if several is not None:
                several.rest(destination.upstream, rest)
            if last:
                raise
            reason = "connect"
        else:
            if response.status not in RETRY_STATUSES:
                if several is not None:
                    several.recovered(destination.upstream)
                return response, destination
            stated = retry_after(response.headers.get("retry-after"), MAX_REST_SECONDS)
            if several is not None:
                several.rest(destination.upstream, max(rest, stated or 0.0))
            if last:
                return response, destination
            reason = str(response.status)
            delay = None if stated is None else min(stated, policy.max_delay_seconds)
            response.close()
        model = metrics.model_label(route.name)
        metrics.upstream_retries.labels(model, reason).inc()
        if attempt % count:  # an upstream not yet tried in this request: at once
            following = destinations[order[attempt % count]]
            metrics.upstream_failovers.labels(model, reason).inc()
            log.warning(
                "upstream failover: model=%s from=%s reason=%s to=%s",
                route.name,
                destination.label,
                reason,
                following.label,
            )
            continue
        if delay is None:
            delay = backoff(attempt // count, policy.backoff_base_seconds, policy.max_delay_seconds)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def backoff(attempt: int, base: float, cap: float) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2^(attempt-1))]."""
    return random.uniform(0, min(cap, base * (2 ** (attempt - 1))))


def retry_after(value: str | None, cap: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date), capped."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return max(0.0, min(cap, seconds))
