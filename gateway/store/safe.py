"""A store whose failures become "no cache", and which finds its way back quickly (design D13.1).

The rule this module keeps: **a store never fails a request.** `SafeStore` turns every
`StoreError` into "no cache": `get` finds nothing, `put` stores nothing, `lock` hands out a
local lock (no cross-replica coordination, but the work still gets done). Each degraded
operation is counted in `compactgate_store_errors{op}`; the outage is logged once when it
starts and once when it ends.

While the store is down, requests leave it alone (none waits for a dead server's timeout) and
one background task pings it every `probe_s`: the first answer ends the outage, so the store
is used again within about `probe_s` of answering. Its connections are dropped when the outage
starts, so none left from before it is used again. `reachable` says whether it answers now
(readiness asks it); `epoch` grows each time the store comes back after an outage or a check
finds it emptied, and whoever remembers what the store holds forgets it then (D13.4).

A shared store is also checked every `check_s` while it is up (and at once when it comes back):
the backend looks again where its data lives (a Sentinel set's master, design D13.5), then each
of the `checks` reads what it keeps in the store and restores it when missing (the signing key
of refs, design D13.2), returning True when the store had lost it. The same checks carry what
replicas learn and share (windows, calibration, agents' compaction points, design D13.3): a
part that learnt something calls `sync_soon`, and the checks run at once instead of at the
next tick, so what it learnt is in the store within a round trip and every other replica reads
it within `check_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from .base import Lock, Store, StoreError, StoreMetrics

log = logging.getLogger("compactgate.store")

PROBE_S = 0.25  # while the store is down, it is pinged this often
CHECK_S = 1.0  # while it is up, the checks run this often

Check = Callable[[Store], Awaitable[bool]]


class SafeStore:
    """A backend whose failures become "no cache", counted and logged; never raises StoreError."""

    def __init__(
        self,
        backend: Store,
        metrics: StoreMetrics,
        *,
        shared: bool,
        probe_s: float = PROBE_S,
        check_s: float = CHECK_S,
    ) -> None:
        self.backend = backend
        self.shared = shared  # other processes see what it holds
        self.down = False
        self.epoch = 0
        self._metrics = metrics
        self._probe_s = probe_s
        self._check_s = check_s
        self._checks: list[Check] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._wake = asyncio.Event()
        metrics.store_reachable.set(1)

    @property
    def reachable(self) -> bool:
        """Whether the store answered its latest call (readiness: a required store is away)."""
        return not self.down

    def watch(self, check: Check) -> None:
        """Run `check` against the backend while the store is up (shared stores only)."""
        self._checks.append(check)

    def sync_soon(self) -> None:
        """Run the checks now rather than at the next tick (something learnt is to be shared).
        Outside a running event loop, or with nothing shared, it does nothing."""
        if not self.shared:
            return
        try:
            self._start()
        except RuntimeError:  # no running loop: the next tick shares it
            return
        self._wake.set()

    async def sync(self) -> None:
        """Run the checks now and wait for them (a shared store that is up): what this process
        learnt is in the store, and what the others wrote is read, when it returns."""
        if self.shared and not self.down:
            await self._check()

    # -- the operations ----------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        if self._skipped("get"):
            return None
        try:
            return await self.backend.get(key)
        except StoreError as error:
            self._failed("get", error)
            return None

    async def put(self, key: str, value: bytes, ttl_s: float | None) -> bool:
        if self._skipped("put"):
            return False
        try:
            await self.backend.put(key, value, ttl_s)
        except StoreError as error:
            self._failed("put", error)
            return False
        return True

    async def put_new(self, key: str, value: bytes, ttl_s: float | None) -> bytes | None:
        """What `key` held before (None: it now holds `value`), or `value` itself when the store
        is away (nothing shared: the caller goes on with its own)."""
        if self._skipped("put"):
            return value
        try:
            return await self.backend.put_new(key, value, ttl_s)
        except StoreError as error:
            self._failed("put", error)
            return value

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if self._skipped("get"):
            return [None] * len(keys)
        try:
            return await self.backend.get_many(keys)
        except StoreError as error:
            self._failed("get", error)
            return [None] * len(keys)

    async def put_many(self, items: Sequence[tuple[str, bytes]], ttl_s: float | None) -> bool:
        if self._skipped("put"):
            return False
        try:
            await self.backend.put_many(items, ttl_s)
        except StoreError as error:
            self._failed("put", error)
            return False
        return True

    async def touch_many(self, keys: Sequence[str], ttl_s: float | None) -> list[bool] | None:
        """Whether each key holds a value (see `Store.touch_many`); None when the store is away."""
        if self._skipped("touch"):
            return None
        try:
            return await self.backend.touch_many(keys, ttl_s)
        except StoreError as error:
            self._failed("touch", error)
            return None

    async def delete(self, key: str) -> bool:
        if self._skipped("delete"):
            return False
        try:
            await self.backend.delete(key)
        except StoreError as error:
            self._failed("delete", error)
            return False
        return True

    async def lock(self, key: str, ttl_s: float) -> Lock | None:
        """The lock, None if another holder has it, or a local stand-in while the store is down."""
        if self._skipped("lock"):
            return Lock(key, "", shared=False)
        try:
            return await self.backend.lock(key, ttl_s)
        except StoreError as error:
            self._failed("lock", error)
            return Lock(key, "", shared=False)

    async def release(self, lock: Lock) -> None:
        if not lock.shared or self._skipped("release"):
            return  # a lock we could not release expires by itself
        try:
            await self.backend.release(lock)
        except StoreError as error:
            self._failed("release", error)

    async def incr(self, key: str, ttl_s: float | None) -> int | None:
        if self._skipped("incr"):
            return None
        try:
            return await self.backend.incr(key, ttl_s)
        except StoreError as error:
            self._failed("incr", error)
            return None

    async def ping(self) -> str | None:
        """None if the backend answers now, else why not. Asked even during an outage (an
        answer ends it, as the probe's would)."""
        self._start()
        try:
            await self.backend.ping()
        except StoreError as error:
            self._failed("ping", error)
            return str(error)
        if self.down:
            await self._recovered()
        return None

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.backend.close()

    # -- outage and recovery -----------------------------------------------------------------

    def _skipped(self, op: str) -> bool:
        """True (counted) when `op` must not reach the backend: the store is down."""
        self._start()
        if self.down:
            self._metrics.store_errors.labels(op).inc()
            return True
        return False

    def _failed(self, op: str, error: StoreError) -> None:
        self._metrics.store_errors.labels(op).inc()
        if self.down:
            return
        self.down = True
        self._metrics.store_reachable.set(0)
        log.warning("store unavailable, running without a cache: %s failed: %s", op, error)
        self._wake.set()

    async def _recovered(self) -> None:
        if not self.down:
            return
        self.down = False
        self.epoch += 1
        self._metrics.store_reachable.set(1)
        log.warning("store available again")
        await self._check()

    def _start(self) -> None:
        """Start the watch in the running loop, once (a shared store only: the memory store
        neither fails nor holds anything for others)."""
        if self._task is None and self.shared and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="store-watch")

    async def _watch(self) -> None:
        # Ends on `_closed` too: Python 3.11's wait_for may swallow the cancellation that
        # `close` sends when the wake-up comes at the same moment.
        while not self._closed:
            if self.down:
                await self._probe()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._check_s)
            self._wake.clear()
            if not self.down:
                await self._check()

    async def _probe(self) -> None:
        """Drop the connections, then ping every `probe_s` until the store answers."""
        self._wake.clear()
        await self.backend.reset()
        while self.down:
            await asyncio.sleep(self._probe_s)
            try:
                await self.backend.ping()
            except StoreError:
                self._metrics.store_errors.labels("ping").inc()
                continue
            await self._recovered()

    async def _check(self) -> None:
        try:
            await self.backend.refresh()
        except StoreError as error:
            self._failed("check", error)
            return
        for check in self._checks:
            try:
                lost = await check(self.backend)
            except StoreError as error:
                self._failed("check", error)
                return
            if lost:
                self.epoch += 1
