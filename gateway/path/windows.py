"""The context window each model is compacted to: its configured (or registry) window, lowered
by what an upstream's context-window error says (design D6.3), never raised; and with a shared
store, lowered by what any replica learnt (design D13.3).

One `Windows` per process holds what was learnt; every part that needs a model's window (the
request path, summaries, agents' compaction, `/v1/models`, the operator page) asks it.

Shared, the rule is the same in every replica: a learnt window only ever goes down, the largest
prompt answered only ever up. Each replica keeps its own figures (so a request never waits for
the store) and merges the store's into them on the store's checks (`SafeStore.watch`, every
`store_sync_s`): the lower window and the larger answered prompt win, and a replica whose
figures beat the store's writes them back. A replica that learns something asks for the merge
at once (`sync_soon`), so the others see it within one period. Two replicas writing at once may
leave the store the higher window for one period; the lower one is written again at the next
merge, and no replica's own window rises meanwhile. Without the store, each replica keeps what
it learnt itself, as a single process does.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Mapping

import orjson

from ..ops.metrics import Metrics
from ..routing import Route
from ..store import SafeStore, Store
from ..store.records import record

log = logging.getLogger("compactgate")

KEY_PREFIX = "window:"  # + a digest of the model's name
TTL_S = 7 * 24 * 3600  # kept this long after the last change (then the configured window again)
MAX_SHARED = 256  # models whose figures each check reads and writes


class Windows:
    """Effective context windows, by model name."""

    def __init__(self, metrics: Metrics, store: SafeStore | None = None) -> None:
        self._metrics = metrics
        self._learned: dict[str, int] = {}
        self._served: dict[str, int] = {}  # the largest prompt each model's upstream answered
        # The models asked about lately, with their own windows: those whose figures are shared.
        self._configured: OrderedDict[str, int | None] = OrderedDict()
        self._store = store if store is not None and store.shared else None
        if self._store is not None:
            self._store.watch(self._sync)

    def served(self, route: Route, tokens: int) -> None:
        """The upstream answered a prompt of `tokens` (the gateway's units): its window holds at
        least that, so an error that states no window is not about a request no larger."""
        if route.name not in self._configured:
            self._asked(route)
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
        if route.name not in self._configured:
            self._asked(route)
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
            self._lower(route.name, limit, current, signature)
            if self._store is not None:
                self._store.sync_soon()  # the other replicas see it within one period

    def _asked(self, route: Route) -> None:
        """A model to share figures for; the least recently new beyond `MAX_SHARED` is not (a
        glob in the config may resolve many names)."""
        self._configured[route.name] = route.context_window
        while len(self._configured) > MAX_SHARED:
            self._configured.popitem(last=False)

    def _lower(self, name: str, limit: int, current: int | None, source: str) -> None:
        self._learned[name] = limit
        self._metrics.window_lowered.labels(self._metrics.model_label(name)).inc()
        log.warning(
            "model %s: upstream reports a %d-token context window (%s); was %s",
            name,
            limit,
            source,
            current,
        )

    async def _sync(self, backend: Store) -> bool:
        """Merge the store's figures into this replica's and write back where ours beat them
        (module docstring). Raises StoreError (the store's check counts it). Never reports the
        store as emptied: a missing record is simply written again."""
        names = list(self._configured)
        if not names:
            return False
        keys = [window_key(name) for name in names]
        values = await backend.get_many(keys)
        writes: list[tuple[str, bytes]] = []
        for name, key, value in zip(names, keys, values, strict=True):
            learned, served = _decode(value)
            if served > self._served.get(name, 0):
                self._served[name] = served
            configured = self._configured.get(name)
            current = self._learned.get(name)
            if learned is not None and (current is None or learned < current):
                if configured is None or learned < configured:
                    was = current if current is not None else configured
                    self._lower(name, learned, was, "learnt by another replica")
            lowest = [w for w in (learned, self._learned.get(name)) if w is not None]
            merged = (min(lowest) if lowest else None, max(served, self._served.get(name, 0)))
            if merged != (learned, served):
                writes.append((key, _encode(*merged)))
        if writes:
            await backend.put_many(writes, TTL_S)
        return False


def window_key(name: str) -> str:
    """Where the store keeps a model's shared window figures (its name hashed: no tenant, since
    a window is the upstream's, and no brace in a name makes a Cluster hash tag)."""
    return (
        KEY_PREFIX
        + hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    )


def _encode(learned: int | None, served: int) -> bytes:
    return orjson.dumps({"v": 1, "learned": learned, "served": served})


def _decode(value: bytes | None) -> tuple[int | None, int]:
    """A stored record's (learned, served); (None, 0) for nothing or anything not ours."""
    data = record(value)
    if data is None:
        return None, 0
    return _positive(data.get("learned")), _positive(data.get("served")) or 0


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
