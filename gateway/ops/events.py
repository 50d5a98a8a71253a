"""The compaction event log: one JSON line per compacted or retried request.

Each event says what happened to one request, phase by phase (detection, each step, success
or recovery), with the tokens before/after of every step, what was removed, whether a
summary was used, the retries and the outcome. It carries a reward (`reward`) so the log can be used
to tune policies offline. Message content is included only with `events.log_content: true`.

Events go to a JSON-lines file (or stdout with `path: "-"`) and to a bounded in-memory list that
`GET /v1/compactgate/events` and the `/ui` page read. Beside them the log keeps, in memory only,
one small `RequestSample` per request (compacted or not, answered or failed) and one entry per
call the gateway paid for itself, so the operator page can aggregate any recent time range
(`overview`); both are bounded (`events.keep_requests`), the oldest dropped first.
"""

from __future__ import annotations

import collections
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from ..config import EventLogConfig

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
    """A score for tuning policies offline, in [-2, 2]: success, tokens saved and priorities kept
    raise it; failure, recovery and time over 500 ms lower it. No coherence is measured (0)."""
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
class RequestSample:
    """What one request came to, as the operator page aggregates it (no content, no keys).

    Costs are USD; None where the price is unknown or the answer's usage was not seen (then the
    request counts as unpriced, never as free). `event` is the seq of its compaction event.
    A value, never changed once made; not frozen only because a frozen dataclass takes several
    times longer to build, and one is built on every request.
    """

    ts: float
    request_id: str
    api: str
    model: str
    tenant: str
    status: int
    reason: str = ""  # why it failed (an error code, or the upstream's status); "" when answered
    total_ms: float = 0.0
    upstream_ms: float = 0.0
    tokens_before: int = 0
    tokens_after: int = 0
    observe: bool = False
    steps: str = "none"
    retries: int = 0
    context_errors: int = 0
    internal_rounds: int = 0
    stream: bool = False
    cost_usd: float | None = None
    counterfactual_usd: float | None = None
    saved_usd: float | None = None
    agent_compaction: str | None = None
    agent_outcome: str | None = None
    event: int | None = None
    failed_in_stream: bool = False  # a 200 stream that ended in an error event, not the answer
    saves: bool = True  # a generation (a count_tokens call saves nothing billed)

    @property
    def answered(self) -> bool:
        return 0 < self.status < 400 and not self.failed_in_stream

    @property
    def compacted(self) -> bool:
        return not self.observe and self.steps != "none"

    @property
    def tokens_saved(self) -> int:
        """Prompt tokens compaction removed from a request that was answered (a failed one
        saved nothing; shadow mode forwards the original)."""
        if not (self.saves and self.answered) or self.observe:
            return 0
        return max(0, self.tokens_before - self.tokens_after)

    @property
    def recovered(self) -> bool:
        """The upstream refused it for its context length, and a retry got it answered."""
        return self.context_errors > 0 and self.retries > 0 and self.answered

    @property
    def overhead_ms(self) -> float:
        return max(0.0, self.total_ms - self.upstream_ms)


@dataclass(frozen=True, slots=True)
class OwnSpend:
    """One call the gateway made for itself (a summary): USD, or None when its price is unknown."""

    ts: float
    usd: float | None


@dataclass(slots=True)
class Totals:
    """Running counters since start (the in-memory samples may have dropped older requests)."""

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
        self.requests: collections.deque[RequestSample] = collections.deque(
            maxlen=max(1, config.keep_requests)
        )
        self.spend: collections.deque[OwnSpend] = collections.deque(
            maxlen=max(1, config.keep_requests)
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

    def count_request(self, sample: RequestSample) -> None:
        """One finished request, whatever came of it."""
        totals = self.totals
        totals.requests += 1
        totals.tokens_saved += sample.tokens_saved
        totals.context_errors_avoided += sample.recovered
        self.requests.append(sample)

    def covered_from(self) -> float:
        """When the kept request samples start: the log's start until older ones are dropped."""
        requests = self.requests
        if len(requests) == requests.maxlen:
            return requests[0].ts
        return self.totals.started

    def own_spend(self, usd: float | None) -> None:
        """A call the gateway paid for itself (None: its price is unknown)."""
        self.spend.append(OwnSpend(time.time(), usd))

    def record(self, event: dict[str, Any], content: Any = None) -> int:
        """Add one event (the caller decides it is worth one: compacted or retried); its seq."""
        self._sequence += 1
        event = {"seq": self._sequence, "ts": round(time.time(), 3), **event}
        if self.config.log_content and content is not None:
            event["messages"] = content
        totals = self.totals
        totals.compacted += 1 if event.get("steps") else 0
        totals.retries += event.get("retries", 0)
        totals.over_window_answered += 1 if event.get("over_window") else 0
        self.events.append(event)
        if self._out is not None:
            try:
                self._out.write(orjson.dumps(event) + b"\n")
                self._out.flush()
            except OSError as exc:
                log.error("cannot write the event log: %s", exc)
        return self._sequence

    def snapshot(self, limit: int = 50, after: int = 0, since: float = 0.0) -> dict[str, Any]:
        """The latest events (after seq `after`, at or after time `since`) and the totals."""
        events = [e for e in self.events if e["seq"] > after and e["ts"] >= since][-limit:]
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
