"""How the threads that count tokens share a request's messages and give way to requests.

`gateway.counting.runner` decides what is counted where; this module holds the coordination between
its threads: the state of one count (`Work`), the messages of one request handed out to the
event loop and its helper threads (`SharedCount`), and the background thread's manners toward
requests (`RequestsFirst`, `yield_to_requests`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .tokens import MessageCounter

T = TypeVar("T")

BACKGROUND_NICE = 10  # added to the background counting thread's nice value


class RequestsFirst:
    """Background counting waits while a request's own count runs on the event loop.

    The two would otherwise take turns at the GIL: the event loop gets it back after each of
    its tiktoken calls only when the background thread lets go, and that thread holds it for
    the Python around each of its own messages. The background thread looks before each
    message (and before any other work) and waits, without the GIL, until no request is
    counting; a message it has begun it finishes. A request count is always short and ends
    in `counting`'s `finally`, so the wait ends too; under a steady stream of counted requests
    the late counts wait, held to `MAX_LATE_BYTES` by `Counting.later`.
    """

    def __init__(self) -> None:
        self._calm = threading.Event()  # set: no request is counting
        self._calm.set()
        self._counting = 0  # requests counting now (event loop only)
        self._closed = False

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Around a request's count, on the event loop."""
        self._counting += 1
        if not self._closed:
            self._calm.clear()
        try:
            yield
        finally:
            self._counting -= 1
            if not self._counting:
                self._calm.set()

    def close(self) -> None:
        """Let the background thread go for good (shutting down: nothing may keep it waiting,
        or the interpreter would wait for it at exit)."""
        self._closed = True
        self._calm.set()

    def wait(self) -> None:
        """In the background thread: return once no request is counting."""
        self._calm.wait()

    def after(self, work: Callable[..., T], *args: Any) -> T:
        """In the background thread: `work(*args)` once no request is counting."""
        self._calm.wait()
        return work(*args)


@dataclass(slots=True)
class Work:
    """One `until` call's state: the messages, their bounds and keys, the counts made so far."""

    counter: MessageCounter
    tenant: str
    messages: Sequence[Mapping[str, Any]]
    sizes: Sequence[int]
    fits: Callable[[int], bool] | None
    keys: Sequence[bytes | None]
    counts: list[int | None]
    missing: Sequence[int]

    def bound(self) -> int:
        """The counts made plus the bounds of the messages not counted yet."""
        return sum(self.sizes[i] if c is None else c for i, c in enumerate(self.counts))

    def record(self, index: int, count: int, new: list[tuple[bytes, int]]) -> int:
        """Keep `count` for message `index` (and in `new` if it has a key); the bound's change."""
        self.counts[index] = count
        key = self.keys[index]
        if key is not None:
            new.append((key, count))
        return count - self.sizes[index]


class SharedCount:
    """One request's messages handed out one at a time to the threads that count them together.

    Counts are recorded under the lock in the order they are made, and the first that makes
    `work.fits` hold settles the request: no message is handed out after it. A count made
    after that (a helper was already counting) no longer belongs to the request, which may
    have gone; it goes to the cache and to `late` instead.
    """

    def __init__(self, work: Work, late: Callable[[list[tuple[bytes, int]]], None]) -> None:
        self._work = work
        self._late = late
        self._lock = threading.Lock()
        self._next = 0  # position in work.missing of the next message to hand out
        self._bound = work.bound()
        self._new: list[tuple[bytes, int]] = []
        self._closed = False
        self.settled = False

    def count(self) -> None:
        """Count messages until none is left to take or the request is settled."""
        work = self._work
        uncached, messages = work.counter.uncached, work.messages
        index = self._take(None, 0)
        while index is not None:
            index = self._take(index, uncached(messages[index]))

    def close(self) -> list[tuple[bytes, int]]:
        """The new (key, count) pairs of the request; later counts go to `late`."""
        with self._lock:
            self._closed = True
            return self._new

    def _take(self, done: int | None, count: int) -> int | None:
        """Record `count` for message `done` (None: nothing yet); the next message to count."""
        work = self._work
        with self._lock:
            if self._closed:
                key = None if done is None else work.keys[done]
                if key is not None:
                    work.counter.cache.put_many([(key, count)])
                    self._late([(key, count)])
                return None
            if done is not None:
                self._bound += work.record(done, count, self._new)
                if work.fits is not None and work.fits(self._bound):
                    self.settled = True
            if self.settled or self._next >= len(work.missing):
                return None
            self._next += 1
            return work.missing[self._next - 1]


def yield_to_requests() -> None:
    """Lower the background counting thread's CPU priority (on Linux a thread has its own nice
    value), so that on a busy machine the requests being served run first."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
