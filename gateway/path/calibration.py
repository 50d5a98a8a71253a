"""Self-calibration of token estimates against what the upstream reports (design D12.3).

Every response's reported prompt tokens (`Usage.input`: every prompt token, cached or not, on
every API) are compared with the gateway's estimate of what it sent; the relative error goes
to a histogram metric for every model. For heuristic (`chars:`) tokenizers the gateway also
calibrates a multiplier per model, by one rule: **the multiplier changes rarely, and only when
the upstream persistently disagrees with it**, because counts decide what is forwarded (where
compaction cuts, what summaries cover). A multiplier that followed each response's noise would
count one unchanged body differently from one request to the next.

- Each response gives one observation: the multiplier that would have made the estimate exact,
  bounded to `BOUNDS`.
- The first multiplier is the median of the first `FIRST_SAMPLES` observations; afterwards the
  median of the last `WINDOW` observations replaces it only when it is more than `TOLERANCE`
  away. The median ignores the odd outlier (a response whose usage covers more than its prompt).
- Between two changes, identical bodies get identical counts; with steady reports the multiplier
  stops changing after a few responses (`tests/test_calibration.py` replays a recorded series).

Exact tokenizers are never corrected.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from dataclasses import dataclass, field

import orjson

from ..counting.tokenizers import CharsTokenizer
from ..ops.metrics import Metrics
from ..routing import Route

log = logging.getLogger("compactgate.calibration")

FIRST_SAMPLES = 3  # observations before the first change
WINDOW = 5  # recent observations whose median is compared with the multiplier in use
TOLERANCE = 0.03  # the multiplier changes when that median is further away than this
BOUNDS = (0.2, 5.0)  # the multiplier stays within these


@dataclass(slots=True)
class _State:
    correction: float  # in use
    observed: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    samples: int = 0
    changes: int = 0


class Calibration:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._state: dict[str, _State] = {}

    def observe(
        self, route: Route, estimated: int, reported: int, counted_with: float | None = None
    ) -> None:
        """One response: `estimated` prompt tokens (counted with multiplier `counted_with`, the
        one in use when the request was prepared) against `reported` by the upstream."""
        if reported <= 0 or estimated <= 0:
            return
        label = self._metrics.model_label(route.name)
        self._metrics.estimate(label, estimated, reported)
        tokenizer = route.counter.tokenizer
        if not isinstance(tokenizer, CharsTokenizer):
            return
        state = self._state.setdefault(route.name, _State(tokenizer.correction))
        used = counted_with if counted_with is not None else state.correction
        state.observed.append(min(BOUNDS[1], max(BOUNDS[0], used * reported / estimated)))
        state.samples += 1
        if state.samples < FIRST_SAMPLES:
            return
        median = statistics.median(state.observed)
        if abs(median / state.correction - 1) <= TOLERANCE:
            return
        state.correction = median
        state.changes += 1
        route.counter.use_tokenizer(tokenizer.with_correction(median))
        log.info(
            "model %s: token estimates corrected by %.4f after %d responses (change %d)",
            route.name,
            median,
            state.samples,
            state.changes,
        )

    def correction(self, route_name: str) -> float | None:
        state = self._state.get(route_name)
        return state.correction if state else None


def prompt_tokens_from_json(body: bytes) -> int | None:
    """`usage.prompt_tokens` of a non-streaming response body; None if absent or unparsable."""
    if b'"usage"' not in body:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _prompt_tokens(data)


def prompt_tokens_from_sse(tail: bytes) -> int | None:
    """`usage.prompt_tokens` from the last SSE event that carries a usage object."""
    for event in reversed(tail.split(b"\n\n")):
        event = event.strip()
        if not event.startswith(b"data:") or b'"usage"' not in event:
            continue
        try:
            data = orjson.loads(event[5:])
        except orjson.JSONDecodeError:
            continue
        found = _prompt_tokens(data)
        if found is not None:
            return found
    return None


def _prompt_tokens(data: object) -> int | None:
    if not isinstance(data, dict):
        return None
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return None
    value = usage.get("prompt_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
