"""The context window each model is compacted to: its configured (or registry) window, lowered
by what an upstream's context-window error says (design D6.3), never raised.

One `Windows` per process holds what was learnt; every part that needs a model's window (the
request path, summaries, agents' compaction, `/v1/models`, the operator page) asks it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..ops.metrics import Metrics
from ..routing import Route

log = logging.getLogger("compactgate")


class Windows:
    """Effective context windows, by model name."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._learned: dict[str, int] = {}
        self._served: dict[str, int] = {}  # the largest prompt each model's upstream answered

    def served(self, route: Route, tokens: int) -> None:
        """The upstream answered a prompt of `tokens` (the gateway's units): its window holds at
        least that, so an error that states no window is not about a request no larger."""
        if tokens > self._served.get(route.name, 0):
            self._served[route.name] = tokens

    def refused(self, route: Route, tokens: int, reserved: int, signature: str) -> None:
        """The upstream refused a prompt of `tokens` that reserved `reserved` for the output,
        with a context error that states no window: the two together bound the window from
        above (whether or not the upstream counts the output). Unless a prompt at least as
        large was answered before: then the refusal says nothing about the window."""
        if tokens > self._served.get(route.name, 0):
            self.learn(route, tokens + reserved, signature)

    @property
    def learned(self) -> Mapping[str, int]:
        """What upstreams said, by model name (the configured window where they said nothing)."""
        return self._learned

    def effective(self, route: Route) -> int | None:
        learned = self._learned.get(route.name)
        if learned is None:
            return route.context_window
        return learned if route.context_window is None else min(route.context_window, learned)

    def learn(self, route: Route, limit: int | None, signature: str) -> None:
        """Lower the model's effective window to an upstream's stated `limit`; never raise it."""
        if limit is None or limit <= 0:
            return
        current = self.effective(route)
        if current is None or limit < current:
            self._learned[route.name] = limit
            self._metrics.window_lowered.labels(self._metrics.model_label(route.name)).inc()
            log.warning(
                "model %s: upstream reports a %d-token context window (%s); was %s",
                route.name,
                limit,
                signature,
                current,
            )
