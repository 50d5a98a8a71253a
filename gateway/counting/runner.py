"""Exact token counts of a request's messages: remembered, shared, and made only as needed.

The rule this module keeps: **a message is tokenized once per tokenizer, wherever its
conversation goes.** A count is looked for under the message's fingerprint
(`MessageCounter.keys`) in the counter's cache (this process), then, when the store is shared
between replicas (Redis), in the store, under a key that also names the tenant; only what
neither has is tokenized, and what is tokenized is kept in both. A conversation that moves to
another replica is therefore not counted again there. (With the in-memory store the counter's
cache is the only copy: the store would hold the same counts in the same process, and take room
from the summaries.)

Counts a request waits for are made one message at a time, stopping as soon as they settle the
decision (`until`): on the event loop, joined by `threads - 1` helper threads
(`server.count_threads`, at most one per core), each taking the next message not taken yet,
where tiktoken runs in parallel (it releases the GIL while it encodes). The event loop never
waits for a helper to start, so a busy helper costs nothing but the message it is counting. A
first-seen 200-message request counted until it fits, on a 2-core machine shared with other work
(`benchmarks.bench_counting`): 0.81-0.89x the time of the event loop alone for 1.00-1.17x the
CPU at load averages of 0.4-2.2, 0.72-1.06x the time for 1.12-1.24x the CPU at 3.2-3.8.

Counts that can wait (the request was decided on its upper bound: `Engine`) are made by one
background thread (`later`), off the event loop. The background work is bounded by the bytes it
holds (`MAX_LATE_BYTES`); beyond that `later` declines and the caller counts on the request
path, which slows clients down instead of growing without limit. The background thread also
gives way to requests (`RequestsFirst`): while a request's own count runs, it pauses between
messages. Otherwise the two take turns at the GIL, and a first-seen request counted while the
previous one's late count ran took 4-12 % longer (in one process, the two ways taking turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..store import SafeStore
from .threads import RequestsFirst, SharedCount, Work, yield_to_requests
from .tokens import MessageCounter

log = logging.getLogger("compactgate.counting")

T = TypeVar("T")

STORE_PREFIX = "count:"
# Below this many bytes to tokenize, a thread hop and a store round trip cost more than
# tiktoken does (it reads about 15 MB/s of English or code on one core).
OFFLOAD_MIN_BYTES = 32 * 1024
MAX_LATE_BYTES = 64 * 1024 * 1024  # message bytes the background counting may hold at once
DEFAULT_THREADS = 0
DEFAULT_TTL_S = 86_400.0


class Counting:
    """Exact per-message counts through the cache, the shared store and the counting threads."""

    def __init__(
        self,
        store: SafeStore | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        threads: int = DEFAULT_THREADS,
    ) -> None:
        self._store = store  # None: counts stay in this process
        self._ttl = ttl_s
        # Threads that join the event loop in counting a request's messages (0 and 1 threads:
        # the event loop counts alone).
        self._helpers = max(0, min(threads, os.cpu_count() or 1) - 1)
        self._now = ThreadPoolExecutor(
            max(1, self._helpers), thread_name_prefix="compactgate-count"
        )
        self._later = ThreadPoolExecutor(
            1, thread_name_prefix="compactgate-count-later", initializer=yield_to_requests
        )
        self._late_bytes = 0
        self._first = RequestsFirst()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.shared = 0  # counts found in the store (made by another replica, or before)

    async def exact(
        self,
        counter: MessageCounter,
        tenant: str,
        messages: Sequence[Mapping[str, Any]],
        sizes: Sequence[int] | None = None,
        *,
        background: bool = False,
    ) -> list[int]:
        """The exact count of each of `messages` (`sizes`: their upper bounds, when known).

        Small work is counted at once; large work is looked up in the cache and the store
        first, then counted on the event loop and its helper threads (`background`: all of
        it in the one background thread).
        """
        counts = await self.until(counter, tenant, messages, sizes, background=background)
        return [count if count is not None else 0 for count in counts]

    async def until(
        self,
        counter: MessageCounter,
        tenant: str,
        messages: Sequence[Mapping[str, Any]],
        sizes: Sequence[int] | None = None,
        fits: Callable[[int], bool] | None = None,
        *,
        background: bool = False,
    ) -> list[int | None]:
        """`exact`, stopping early once `fits(upper bound of the total)` holds: the counts made
        so far plus the bounds (`sizes`) of the rest. A message left uncounted is None."""
        if not messages:
            return []
        if sizes is None:
            sizes = _sizes(counter, messages)
        large = sum(sizes) >= OFFLOAD_MIN_BYTES and counter.bound is not None
        if not large:
            return [counter.message(m) for m in messages]
        if background:
            return await self._until(counter, tenant, messages, sizes, fits, True)
        with self._first.counting():
            return await self._until(counter, tenant, messages, sizes, fits, False)

    async def _until(
        self,
        counter: MessageCounter,
        tenant: str,
        messages: Sequence[Mapping[str, Any]],
        sizes: Sequence[int],
        fits: Callable[[int], bool] | None,
        background: bool,
    ) -> list[int | None]:
        if background:
            keys, counts = await self._run(True, _lookup, counter, messages)
        else:
            keys, counts = _lookup(counter, messages)
        missing = [i for i, count in enumerate(counts) if count is None]
        if missing and self._store is not None:
            missing = await self._from_store(counter, tenant, keys, counts, missing)
        if not missing:
            return counts
        work = Work(counter, tenant, messages, sizes, fits, keys, counts, missing)
        if fits is not None and fits(work.bound()):
            return counts  # the counts remembered already settle it
        if background:
            await self._background(work)
        elif self._helpers and len(missing) > 1:
            await self._together(work)
        else:
            self._inline(work)
        return counts

    def _inline(self, work: Work) -> None:
        """Count on the event loop, one message at a time (no thread to hand over to: the
        cheapest in CPU, and it stops at the first message that settles it)."""
        new: list[tuple[bytes, int]] = []
        bound = work.bound()
        for i in work.missing:
            count = work.counter.uncached(work.messages[i])
            bound += work.record(i, count, new)
            if work.fits is not None and work.fits(bound):
                break
        work.counter.cache.put_many(new)
        self._share(work.tenant, new)

    async def _together(self, work: Work) -> None:
        """Count on the event loop and in the helper threads at once, each taking the next
        message not taken yet, until `work.fits` (or none is left). The event loop never
        waits for a helper to start: a busy helper only leaves it more to count; it waits
        only for the messages the helpers are counting when every count is needed."""
        loop = asyncio.get_running_loop()
        shared = SharedCount(work, lambda late: self._share_from_thread(loop, work.tenant, late))
        helpers = [loop.run_in_executor(self._now, shared.count) for _ in range(self._helpers)]
        try:
            shared.count()
        except BaseException:
            shared.close()  # the helpers stop at their next message
            raise
        if not shared.settled:
            await asyncio.gather(*helpers)
        new = shared.close()
        work.counter.cache.put_many(new)
        self._share(work.tenant, new)

    async def _background(self, work: Work) -> None:
        """Count every missing message in the background thread."""
        chunk = list(work.missing)
        messages = [work.messages[i] for i in chunk]
        made = await self._run(True, _count, work.counter, messages, self._first.wait)
        new: list[tuple[bytes, int]] = []
        for i, count in zip(chunk, made, strict=True):
            work.record(i, count, new)
        work.counter.cache.put_many(new)
        self._share(work.tenant, new)

    async def run(self, background: bool, work: Callable[[], T]) -> T:
        """`work()` in a counting thread (the background one when `background`)."""
        return await self._run(background, work)

    def later(
        self, size: int, work: Callable[[], Coroutine[Any, Any, T]]
    ) -> asyncio.Task[T] | None:
        """Start `work()` (counting `size` bytes) in the background; None when the background
        already holds `MAX_LATE_BYTES` (the caller then counts now)."""
        if self._late_bytes + size > MAX_LATE_BYTES:
            return None
        self._late_bytes += size
        task: asyncio.Task[T] = asyncio.get_running_loop().create_task(work(), name="count-later")
        self._tasks.add(task)

        def finished(done: asyncio.Task[T]) -> None:
            self._tasks.discard(done)
            self._late_bytes -= size
            if not done.cancelled() and done.exception() is not None:
                log.error("counting off the request path failed", exc_info=done.exception())

        task.add_done_callback(finished)
        return task

    async def close(self) -> None:
        """Cancel the background counts (their requests keep their upper bounds) and stop."""
        for task in list(self._tasks):
            task.cancel()
        self._first.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._now.shutdown(wait=False, cancel_futures=True)
        self._later.shutdown(wait=False, cancel_futures=True)

    # -- the store ---------------------------------------------------------------------------

    async def _from_store(
        self,
        counter: MessageCounter,
        tenant: str,
        keys: Sequence[bytes | None],
        counts: list[int | None],
        missing: list[int],
    ) -> list[int]:
        """Fill `counts` from the shared store; the indices still missing."""
        assert self._store is not None
        asked = [(i, key) for i in missing if (key := keys[i]) is not None]
        if not asked:
            return missing
        values = await self._store.get_many([_store_key(tenant, key) for _, key in asked])
        found: list[tuple[bytes, int]] = []
        for (i, key), value in zip(asked, values, strict=True):
            count = _number(value)
            if count is not None:
                counts[i] = count
                found.append((key, count))
        if found:
            counter.cache.put_many(found)
            self.shared += len(found)
        return [i for i in missing if counts[i] is None]

    def _share(self, tenant: str, new: Sequence[tuple[bytes, int]]) -> None:
        """Put new counts into the shared store, without waiting for it."""
        store = self._store
        if store is None or not new:
            return
        items = [(_store_key(tenant, key), b"%d" % count) for key, count in new]
        task = asyncio.get_running_loop().create_task(
            store.put_many(items, self._ttl), name="count-share"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _share_from_thread(
        self, loop: asyncio.AbstractEventLoop, tenant: str, new: Sequence[tuple[bytes, int]]
    ) -> None:
        """`_share` for counts a helper thread made after its request was decided."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to share with
            loop.call_soon_threadsafe(self._share, tenant, new)

    async def _run(self, background: bool, work: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        if background:
            return await loop.run_in_executor(self._later, self._first.after, work, *args)
        return await loop.run_in_executor(self._now, work, *args)


def _lookup(
    counter: MessageCounter, messages: Sequence[Mapping[str, Any]]
) -> tuple[list[bytes | None], list[int | None]]:
    keys = counter.keys(messages)
    return keys, counter.cache.get_many(keys)


def _count(
    counter: MessageCounter, messages: Sequence[Mapping[str, Any]], pause: Callable[[], None]
) -> list[int]:
    """Each message's count, calling `pause` before each (requests go first)."""
    counts = []
    for message in messages:
        pause()
        counts.append(counter.uncached(message))
    return counts


def _sizes(counter: MessageCounter, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Byte sizes that tell large work from small: the upper bound where there is one."""
    bound = counter.bound
    if bound is None:
        return [0] * len(messages)
    return [bound.message(m) for m in messages]


def _store_key(tenant: str, key: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    name = tenant.encode()
    digest.update(len(name).to_bytes(8, "big"))
    digest.update(name)
    digest.update(key)
    return STORE_PREFIX + digest.hexdigest()


def _number(value: bytes | None) -> int | None:
    if value is None:
        return None
    try:
        count = int(value)
    except ValueError:
        return None
    return count if count >= 0 else None
