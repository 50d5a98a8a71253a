"""Upstream retry policy (R4.11, 004 defaults): 429, 5xx and connection failures.

Retried with exponential backoff and full jitter, honouring `Retry-After` (seconds or an HTTP
date), bounded by the route's `max_attempts` and `max_delay_seconds`. Only failures that come
before any byte of a response reached the client are retried: this runs before relaying starts.
Timeouts are not retried (the client has already waited the whole timeout).
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Mapping

from .errors import UpstreamUnreachableError
from .metrics import Metrics
from .routing import Route
from .upstream import UpstreamClient, UpstreamResponse

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


async def send_with_retries(
    client: UpstreamClient,
    route: Route,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    metrics: Metrics,
) -> UpstreamResponse:
    policy = route.retry
    attempt = 1
    while True:
        try:
            response = await client.open("POST", url, headers, body)
        except UpstreamUnreachableError:
            if attempt >= policy.max_attempts:
                raise
            metrics.upstream_retries.labels(metrics.model_label(route.name), "connect").inc()
            await asyncio.sleep(
                backoff(attempt, policy.backoff_base_seconds, policy.max_delay_seconds)
            )
            attempt += 1
            continue
        if response.status not in RETRY_STATUSES or attempt >= policy.max_attempts:
            return response
        delay = retry_after(response.headers.get("retry-after"), policy.max_delay_seconds)
        if delay is None:
            delay = backoff(attempt, policy.backoff_base_seconds, policy.max_delay_seconds)
        response.close()
        metrics.upstream_retries.labels(metrics.model_label(route.name), str(response.status)).inc()
        await asyncio.sleep(delay)
        attempt += 1


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
