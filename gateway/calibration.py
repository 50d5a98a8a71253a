"""Self-calibration of token estimates against what the upstream reports (R2.6).

Every response's `usage.prompt_tokens` is compared with the gateway's estimate of what it sent.
The relative error goes to a histogram metric for every model. For heuristic (`chars:`)
tokenizers the gateway also keeps a running estimate of the correction per model: each
observation moves it a step (`ALPHA`) toward reported/estimated, so after a few dozen responses
the estimates track the provider's own tokenizer. Exact tokenizers are never corrected.

The correction in use only changes when the running estimate has moved more than `TOLERANCE`
away from it. Every change changes every count a little, and counts decide where compaction
cuts (cache-stable cuts, the ranges summaries cover): a correction that followed each response's
noise would move those a little on every request, and with them the prompt prefix sent upstream
and the summaries' cache keys. So the correction converges in a few steps and then stays put
while the upstream's answers agree with it within the tolerance.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import orjson

from .metrics import Metrics
from .routing import Route
from .tokenizers import CharsTokenizer

log = logging.getLogger("compactgate.calibration")

ALPHA = 0.3  # step toward the observed ratio per response
TOLERANCE = 0.02  # the correction in use changes when the estimate moves further away than this
MAX_STEP = 2.0  # one observation moves the correction by at most this factor
BOUNDS = (0.2, 5.0)  # the correction stays within these multipliers


@dataclass(slots=True)
class _State:
    correction: float = 1.0  # in use
    estimate: float = 1.0  # running estimate
    samples: int = 0


class Calibration:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._state: dict[str, _State] = {}

    def observe(self, route: Route, estimated: int, reported: int) -> None:
        if reported <= 0 or estimated <= 0:
            return
        label = self._metrics.model_label(route.name)
        self._metrics.estimate_error.labels(label).observe((estimated - reported) / reported)
        tokenizer = route.counter.tokenizer
        if not isinstance(tokenizer, CharsTokenizer):
            return
        state = self._state.setdefault(
            route.name, _State(tokenizer.correction, tokenizer.correction)
        )
        # `estimated` was counted with the correction in use: this response says the right
        # multiplier is that times the ratio.
        ratio = min(MAX_STEP, max(1 / MAX_STEP, reported / estimated))
        observed = state.correction * ratio
        estimate = state.estimate + ALPHA * (observed - state.estimate)
        state.estimate = min(BOUNDS[1], max(BOUNDS[0], estimate))
        state.samples += 1
        if abs(state.estimate / state.correction - 1) > TOLERANCE:
            state.correction = state.estimate
            route.counter.use_tokenizer(tokenizer.with_correction(state.estimate))
        if state.samples in (1, 10, 100) or state.samples % 1000 == 0:
            log.info(
                "model %s: estimate %d vs reported %d prompt tokens; "
                "correction now %.4f (%d samples)",
                route.name,
                estimated,
                reported,
                state.correction,
                state.samples,
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
