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

With a shared store (design D13.3) the replicas calibrate as one: the state (multiplier, recent
observations, how many) is kept in the store per model, and a replica's observations go there
instead of deciding locally. On the store's checks (`SafeStore.watch`, every `store_sync_s`) a
replica reads the state, adds what it observed since, applies the rule above to the whole,
writes it back and counts with the multiplier it holds. So every replica changes its
multiplier when the others do, within two periods (the observer's, then the reader's), and the
change is the one a single process would make from the same responses. Two replicas writing at
the same moment may lose one's observations (the median is made for that). With the store away,
each replica decides from its own observations as a single process does.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
from collections import deque
from dataclasses import dataclass, field

import orjson

from ..counting.tokenizers import CharsTokenizer
from ..ops.metrics import Metrics
from ..routing import Route
from ..store import SafeStore, Store
from ..store.records import record

log = logging.getLogger("compactgate.calibration")

FIRST_SAMPLES = 3  # observations before the first change
WINDOW = 5  # recent observations whose median is compared with the multiplier in use
TOLERANCE = 0.03  # the multiplier changes when that median is further away than this
BOUNDS = (0.2, 5.0)  # the multiplier stays within these
KEY_PREFIX = "calibration:"  # + a digest of the model's name
TTL_S = 7 * 24 * 3600
MAX_SHARED = 256  # models whose calibration each check reads and writes


@dataclass(slots=True)
class _State:
    correction: float  # in use
    observed: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    samples: int = 0
    changes: int = 0


class Calibration:
    def __init__(self, metrics: Metrics, store: SafeStore | None = None) -> None:
        self._metrics = metrics
        self._state: dict[str, _State] = {}
        self._store = store if store is not None and store.shared else None
        self._routes: dict[str, Route] = {}  # heuristic models observed: shared state applies
        self._pending: dict[str, list[float]] = {}  # observed here, not yet in the store
        if self._store is not None:
            self._store.watch(self._sync)

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
        observed = min(BOUNDS[1], max(BOUNDS[0], used * reported / estimated))
        if self._store is not None and not self._store.down:
            self._routes[route.name] = route
            if len(self._routes) > MAX_SHARED:  # a glob in the config may resolve many names
                self._routes.pop(next(iter(self._routes)))
            # Decided with the other replicas' observations at the next check (not at once:
            # the multiplier changes rarely, and a write per response would cost Redis more).
            self._pending.setdefault(route.name, []).append(observed)
            return
        self._decide(route, state, [observed])

    def _decide(self, route: Route, state: _State, observations: list[float]) -> None:
        """The rule (module docstring) over `observations` added to `state`; a changed
        multiplier is put to use."""
        changed = False
        for observed in observations:
            state.observed.append(observed)
            state.samples += 1
            if state.samples < FIRST_SAMPLES:
                continue
            median = statistics.median(state.observed)
            if abs(median / state.correction - 1) <= TOLERANCE:
                continue
            state.correction = median
            state.changes += 1
            changed = True
        if changed:
            log.info(
                "model %s: token estimates corrected by %.4f after %d responses (change %d)",
                route.name,
                state.correction,
                state.samples,
                state.changes,
            )
        self._use(route, state.correction)

    @staticmethod
    def _use(route: Route, correction: float) -> None:
        tokenizer = route.counter.tokenizer
        if isinstance(tokenizer, CharsTokenizer) and tokenizer.correction != correction:
            route.counter.use_tokenizer(tokenizer.with_correction(correction))

    async def _sync(self, backend: Store) -> bool:
        """Read each observed model's shared state, add this replica's observations, apply the
        rule, write it back, and count with the result (module docstring). Raises StoreError
        (the store's check counts it; the observations stay pending)."""
        names = list(self._routes)
        if not names:
            return False
        keys = [calibration_key(name) for name in names]
        values = await backend.get_many(keys)
        writes: list[tuple[str, bytes]] = []
        taken: dict[str, list[float]] = {}
        for name, key, value in zip(names, keys, values, strict=True):
            route = self._routes[name]
            state = self._state.setdefault(name, _State(_correction(route)))
            shared = _decode(value)
            if shared is not None:
                state.correction, state.samples, state.changes = shared[0], shared[2], shared[3]
                state.observed = deque(shared[1], maxlen=WINDOW)
            pending = taken[name] = self._pending.pop(name, [])
            self._decide(route, state, pending)
            if pending or shared is None:
                writes.append((key, _encode(state)))
        try:
            if writes:
                await backend.put_many(writes, TTL_S)
        except BaseException:
            for name, pending in taken.items():  # counted again at the next check
                self._pending[name] = pending + self._pending.get(name, [])
            raise
        return False

    def correction(self, route_name: str) -> float | None:
        state = self._state.get(route_name)
        return state.correction if state else None


def calibration_key(name: str) -> str:
    """Where the store keeps a model's shared calibration (its name hashed)."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=16)
    return KEY_PREFIX + digest.hexdigest()


def _correction(route: Route) -> float:
    tokenizer = route.counter.tokenizer
    return tokenizer.correction if isinstance(tokenizer, CharsTokenizer) else 1.0


def _encode(state: _State) -> bytes:
    return orjson.dumps(
        {
            "v": 1,
            "correction": state.correction,
            "observed": list(state.observed),
            "samples": state.samples,
            "changes": state.changes,
        }
    )


def _decode(value: bytes | None) -> tuple[float, list[float], int, int] | None:
    """A stored state (correction, observed, samples, changes); None for nothing or anything
    not ours."""
    data = record(value)
    if data is None:
        return None
    correction, observed = data.get("correction"), data.get("observed")
    samples, changes = data.get("samples"), data.get("changes")
    if not (
        isinstance(correction, float)
        and BOUNDS[0] <= correction <= BOUNDS[1]
        and isinstance(observed, list)
        and all(isinstance(x, float) for x in observed)
        and isinstance(samples, int)
        and isinstance(changes, int)
    ):
        return None
    return correction, observed[-WINDOW:], samples, changes


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
