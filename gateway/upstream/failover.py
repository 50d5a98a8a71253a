"""Several upstreams for one model name: which one a request tries first, which next.

The rule this module keeps: within one request every upstream of the model is tried once before
any is tried again; the healthy ones come first, in an order drawn by weight (an upstream of
weight 2 leads twice as often as one of weight 1), then those resting after a failure, the one
whose rest ends first leading. An upstream rests after a connection failure, a 5xx or a 429:
for `retry.cooldown_seconds`, or for its 429's Retry-After when that is longer. Resting only
reorders: no upstream is ever refused, so a model whose upstreams all failed is still tried.
The state is per process (each replica learns for itself), kept in memory, bounded by the config.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..config import Provider, UpstreamConfig


@dataclass(frozen=True, slots=True)
class Destination:
    """One upstream as a request reaches it: the URL for this API path and the headers. A
    litellm upstream's URL is its api_base; its passthrough paths go over plain HTTP
    (`transport="openai"`)."""

    upstream: UpstreamConfig
    url: str
    headers: Mapping[str, str]
    transport: Provider | None = None  # None: the upstream's own provider

    @property
    def provider(self) -> Provider:
        """The transport this request takes."""
        return self.transport or self.upstream.provider

    @property
    def label(self) -> str:
        """Where it goes, fit for logs and metrics: host and port, never a credential."""
        return describe(self.upstream)


def describe(upstream: UpstreamConfig) -> str:
    if upstream.base_url is None:
        return f"litellm:{upstream.model or '-'}"
    parts = urlsplit(upstream.base_url)
    host = parts.hostname or "-"
    return f"{host}:{parts.port}" if parts.port else host


def _key(upstream: UpstreamConfig) -> tuple[str | None, ...]:
    return (upstream.provider, upstream.base_url, upstream.model, upstream.api_key)


class Balancer:
    """Orders a model's upstreams for each request and remembers which are resting."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._clock = clock
        self._rng = rng or random.Random()
        self._resting: dict[tuple[str | None, ...], float] = {}

    def order(self, upstreams: Sequence[UpstreamConfig]) -> list[int]:
        """Indexes of `upstreams` in the order this request tries them."""
        if len(upstreams) == 1:
            return [0]
        now = self._clock()
        until = [self._resting.get(_key(u), 0.0) for u in upstreams]
        indexes = range(len(upstreams))
        healthy = [i for i in indexes if until[i] <= now]
        resting = sorted((i for i in indexes if until[i] > now), key=until.__getitem__)
        # Weighted order without replacement (Efraimidis-Spirakis): sort by u^(1/weight).
        draws = {i: self._rng.random() ** (1.0 / upstreams[i].weight) for i in healthy}
        return sorted(healthy, key=draws.__getitem__, reverse=True) + resting

    def rest(self, upstream: UpstreamConfig, seconds: float) -> None:
        """Put `upstream` last for `seconds` (never shortening a longer rest already set)."""
        key = _key(upstream)
        until = self._clock() + seconds
        if until > self._resting.get(key, 0.0):
            self._resting[key] = until

    def recovered(self, upstream: UpstreamConfig) -> None:
        """It answered: no longer resting."""
        self._resting.pop(_key(upstream), None)

    def resting(self, upstream: UpstreamConfig) -> bool:
        return self._resting.get(_key(upstream), 0.0) > self._clock()
