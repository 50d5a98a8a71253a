"""The compaction event log: one JSON line per compacted or retried request.

Each event says what happened to one request, in 004's phases (detection, each strategy,
success or recovery), with the tokens before/after of every step, what was removed, whether a
summary was used, the retries and the outcome. It carries 004's reward so the log can be used to
tune policies offline. Message content is included only with `events.log_content: true`.

Events go to a JSON-lines file (or stdout with `path: "-"`) and to a bounded in-memory list that
`GET /v1/compactgate/events` and the `/ui` page read.
"""

from __future__ import annotations

import collections
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from .config import EventLogConfig

log = logging.getLogger("compactgate.events")


def reward(
    success: bool,
    used_recovery: bool,
    tokens_before: int,
    tokens_after: int,
    priority_preserved: float,
    time_ms: float,
    coherence_delta: float = 0.0,
) -> float:
    """004's RL reward, clamped to [-2, 2]. The gateway measures no coherence, so it is 0."""
    value = 0.0
    if success:
        value += 1.0 + coherence_delta * 0.5
        if tokens_before > 0:
            value += (tokens_before - tokens_after) / tokens_before * 0.3
        value += priority_preserved * 0.2
    else:
        value -= 1.0
    if used_recovery:
        value -= 0.7
    if time_ms > 500:
        value -= time_ms / 1000 * 0.1
    return max(-2.0, min(2.0, value))


@dataclass(slots=True)
class Totals:
    """Running counters the operator page shows."""

    requests: int = 0
    compacted: int = 0
    tokens_saved: int = 0  # by answered generations only (compactgate_tokens_saved_total)
    # Requests the upstream refused with a context-window error, answered after the gateway
    # compacted and retried: the same count as compactgate_context_errors_avoided_total.
    context_errors_avoided: int = 0
    # An estimate, kept apart: answered requests that were larger than the window before
    # compaction (compactgate_over_window_answered_total).
    over_window_answered: int = 0
    retries: int = 0
    started: float = field(default_factory=time.time)


class EventLog:
    def __init__(self, config: EventLogConfig) -> None:
        self.config = config
        self.events: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=max(1, config.keep)
        )
        self.totals = Totals()
        self._sequence = 0
        self._out: IO[bytes] | None = None
        if config.path == "-":
            self._out = sys.stdout.buffer
        elif config.path:
            self._out = open(config.path, "ab")

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stdout.buffer:
            self._out.close()
        self._out = None

    def count_request(self) -> None:
        self.totals.requests += 1

    def record(self, event: dict[str, Any], content: Any = None) -> None:
        """Add one event (the caller decides it is worth one: compacted or retried)."""
        self._sequence += 1
        event = {"seq": self._sequence, "ts": round(time.time(), 3), **event}
        if self.config.log_content and content is not None:
            event["messages"] = content
        totals = self.totals
        totals.compacted += 1 if event.get("steps") else 0
        totals.tokens_saved += event.get("tokens_saved", 0)
        totals.retries += event.get("retries", 0)
        totals.context_errors_avoided += 1 if event.get("context_error_recovered") else 0
        totals.over_window_answered += 1 if event.get("over_window") else 0
        self.events.append(event)
        if self._out is not None:
            try:
                self._out.write(orjson.dumps(event) + b"\n")
                self._out.flush()
            except OSError as exc:
                log.error("cannot write the event log: %s", exc)

    def snapshot(self, limit: int = 50, after: int = 0) -> dict[str, Any]:
        events = [e for e in self.events if e["seq"] > after][-limit:]
        totals = self.totals
        return {
            "events": events,
            "totals": {
                "requests": totals.requests,
                "compacted": totals.compacted,
                "tokens_saved": totals.tokens_saved,
                "context_errors_avoided": totals.context_errors_avoided,
                "over_window_answered": totals.over_window_answered,
                "retries": totals.retries,
                "uptime_s": round(time.time() - totals.started, 1),
            },
        }
