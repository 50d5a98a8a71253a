"""Giving freed heap memory back to the system once a worker is idle again.

After a burst of concurrent streams every request's buffers are freed, but glibc's malloc keeps
the pages: it returns memory only from the top of its heap, so one live chunk above the freed
ones keeps them all resident. `malloc_trim(0)` hands every whole free page of every arena back
(madvise). The rule this module owns: a worker trims only while no request is in flight, and
only once the free bytes malloc holds have risen by `threshold` above their lowest point since
the last trim (memory was used and given back since then); checked every `interval` seconds, it
costs a fraction of a millisecond when there is nothing to do. Where the C library is not glibc
(musl, macOS) it does nothing.

What it cannot return, measured after 500 concurrent slow streams (benchmarks/soak.py burst:
about +18 MiB at the peak, +12 MiB once the upstream pool has expired): all of the rest is
CPython's small-object arenas (1 MiB each; the glibc heap is back to its baseline once trimmed,
thread stacks and other mappings do not move). The peak adds about 12 arenas, and an arena is
unmapped only once every block in it is free. Blocks allocated during the peak outlive it
(tracemalloc, every block allocated after the baseline and alive at the end): about 24,500, all
but 21 of them small-object sized. Most are the entries long-lived caches refreshed (the
per-conversation prefix memo holds the burst's copies of the message dicts); the rest sit in
free lists. With the memo made to keep its older copies and a full `gc.collect()` (which also
empties the built-in tuple and dict free lists), about 1,100 blocks remain, all in the free
lists of C extensions that nothing in Python can empty: uvloop's TimerHandle and callback
handles, aiohttp's client protocol and stream buffers, asyncio locks. No live object is kept per
request or per stream. Spread over the new arenas, they keep all of them, mostly as free pools
that the next peak reuses: RSS does not grow from one burst to the next. Cutting the surviving
blocks by 95 % that way left RSS where it was (+13 to +14 MiB), so neither that nor a collection
before the trim nor `gc.freeze()` is done here.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import platform
from collections.abc import Sized
from typing import Protocol

log = logging.getLogger("compactgate.memory")


# Container allocations between two young-generation collections (CPython's default: 700).
YOUNG_THRESHOLD = 50_000


def freeze_startup_objects() -> None:
    """Leave what start-up made out of every later garbage collection, and collect less often.

    The modules, classes and functions the gateway imports are about 130,000 objects that live
    as long as the process. CPython's full collection walks them all, about 90 ms on a small
    machine, and one comes every few hundred requests, stalling whichever request is in flight.
    Collected once here (start-up garbage is freed), then frozen: a full collection then walks
    only what requests and caches made since. Frozen objects are never collected, which is
    what they would have been anyway.

    A parsed 200-message request is a few thousand containers that live until its answer is
    sent. With the default thresholds a young collection came about once a request and every
    request in flight was walked again and again as it aged into the older generations: at 32
    concurrent agent requests that was about a sixth of the worker's CPU. Almost everything a
    request makes is freed by reference counting when it ends, so collecting after every
    `YOUNG_THRESHOLD` allocations instead finds the same garbage (cycles are rare here) at a
    fraction of the walking.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 20, 100)


INTERVAL_S = 5.0
THRESHOLD_BYTES = 1024 * 1024


class Malloc(Protocol):
    """The C allocator, as far as trimming needs it."""

    def free_bytes(self) -> int: ...

    def trim(self) -> None: ...


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class GlibcMalloc:
    """glibc's malloc through ctypes: `mallinfo2` (glibc 2.33+) and `malloc_trim`."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._mallinfo2 = libc.mallinfo2
        self._mallinfo2.restype = _MallInfo2
        self._mallinfo2.argtypes = []
        self._malloc_trim = libc.malloc_trim
        self._malloc_trim.restype = ctypes.c_int
        self._malloc_trim.argtypes = [ctypes.c_size_t]

    @classmethod
    def load(cls) -> GlibcMalloc | None:
        """This process's glibc malloc, or None (another C library, or a glibc before 2.33)."""
        if platform.libc_ver()[0] != "glibc":
            return None
        try:
            return cls(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"))
        except (OSError, AttributeError):
            return None

    def free_bytes(self) -> int:
        """Free bytes held in malloc's arenas (returned to the system or not)."""
        return int(self._mallinfo2().fordblks)

    def trim(self) -> None:
        self._malloc_trim(0)


class IdleTrim:
    """One worker's trimmer; `start` it from the event loop with the set of requests in flight.

    Created before the worker starts (it is pickled into each worker process) and bound to a
    loop only by `start`, which later calls ignore.
    """

    def __init__(
        self,
        interval: float = INTERVAL_S,
        threshold: int = THRESHOLD_BYTES,
        malloc: Malloc | None = None,
    ) -> None:
        self.interval = interval
        self.threshold = threshold
        self._malloc = malloc
        self._started = False
        self._low = 0
        self.trims = 0

    def __getstate__(self) -> dict[str, object]:
        if self._started:
            raise TypeError("an IdleTrim that has started belongs to its worker")
        return {**self.__dict__, "_malloc": None}  # each worker loads its own C library

    def start(self, loop: asyncio.AbstractEventLoop, in_flight: Sized) -> None:
        """Check every `interval` seconds from now on; `in_flight` is empty when idle."""
        if self._started:
            return
        self._started = True
        self._malloc = self._malloc or GlibcMalloc.load()
        if self._malloc is None:
            log.debug("not glibc: freed memory is left to the C library")
            return
        self._low = self._malloc.free_bytes()
        loop.call_later(self.interval, self._tick, loop, in_flight)

    def check(self, idle: bool) -> bool:
        """One check: trims, and returns True, when idle and enough memory has been freed."""
        assert self._malloc is not None
        free = self._malloc.free_bytes()
        self._low = min(self._low, free)
        if not idle or free - self._low < self.threshold:
            return False
        self._malloc.trim()
        self.trims += 1
        log.debug("returned free heap memory to the system (%d MiB free in malloc)", free >> 20)
        self._low = self._malloc.free_bytes()  # trimming the top of the heap lowers it
        return True

    def _tick(self, loop: asyncio.AbstractEventLoop, in_flight: Sized) -> None:
        if loop.is_closed():
            return
        self.check(idle=len(in_flight) == 0)
        loop.call_later(self.interval, self._tick, loop, in_flight)
