"""Deadlines on the request path that cost almost nothing while they do not expire.

Every request waits under three deadlines (the body read, the upstream's first byte, the whole
answer) and a stream under one per chunk. `asyncio.timeout` arms a timer of the event loop for
each, which under uvloop is a libuv timer made and torn down every time: about 12 µs a
deadline on the benchmark machine, several percent of a request's own cost. Here the deadlines
of a loop share one timer, set for the earliest of them: entering one records the task and the
time it is due, leaving removes it (about 1 µs), and the timer only moves when a deadline due
earlier than every other arrives. When it fires, the deadlines that are due cancel their tasks,
and the timer is set again for the earliest left.

`within(seconds)` keeps `asyncio.timeout`'s contract: a deadline that passes cancels the task,
and the block then raises `TimeoutError` instead of the `CancelledError`; a cancellation from
elsewhere (a client that went away, the server's shutdown) stays a `CancelledError`.
`later(seconds, callback)` puts a call on the same timer: work that only a request outliving
`seconds` needs (watching for the client to hang up) costs the rest of them nothing.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Callable
from types import TracebackType

# A timer of the loop may fire up to its clock resolution early (uvloop counts in
# milliseconds); a deadline due within this of the timer is expired then, not a timer later.
EARLY_S = 0.002


class Deadline:
    """One block's deadline (`with within(seconds):`)."""

    __slots__ = ("_cancelling", "_clock", "_task", "expired", "when")

    def __init__(self, seconds: float | None) -> None:
        self._clock: _Clock | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self.when = math.inf if seconds is None else seconds
        self.expired = False

    def __enter__(self) -> Deadline:
        if self.when == math.inf:
            return self  # no limit: nothing to watch
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._clock = clock = _clock(task.get_loop())
        self.when += clock.loop.time()
        clock.add(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        clock, task = self._clock, self._task
        if clock is None or task is None:
            return  # no limit
        clock.remove(self)
        if self.expired and task.uncancel() <= self._cancelling:
            if kind is asyncio.CancelledError:
                raise TimeoutError from error

    def expire(self) -> None:
        self.expired = True
        assert self._task is not None
        self._task.cancel()


class Later:
    """A call due `seconds` after it was made, unless cancelled first (`later`)."""

    __slots__ = ("_callback", "_clock", "when")

    def __init__(self, clock: _Clock, seconds: float, callback: Callable[[], object]) -> None:
        self._clock = clock
        self._callback = callback
        self.when = clock.loop.time() + seconds
        clock.add(self)

    def cancel(self) -> None:
        self._clock.remove(self)

    def expire(self) -> None:
        self._callback()


class _Clock:
    """The deadlines of one event loop and the one timer that watches them."""

    __slots__ = ("_at", "_live", "_timer", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._live: dict[int, Deadline | Later] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer fires

    def add(self, deadline: Deadline | Later) -> None:
        self._live[id(deadline)] = deadline
        if deadline.when < self._at:
            self._arm(deadline.when)

    def remove(self, deadline: Deadline | Later) -> None:
        self._live.pop(id(deadline), None)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = when
        self._timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer, self._at = None, math.inf
        due = self.loop.time() + EARLY_S
        expired = [d for d in self._live.values() if d.when <= due]
        for deadline in expired:
            del self._live[id(deadline)]
            deadline.expire()
        if self._live:
            self._arm(min(d.when for d in self._live.values()))


_CLOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Clock] = weakref.WeakKeyDictionary()


_last: _Clock | None = None  # the clock of the loop asked for last (a serving process has one)


def within(seconds: float | None) -> Deadline:
    """A deadline `seconds` from when the block is entered (None: none), as `asyncio.timeout`;
    used as `with within(seconds):` inside a task."""
    return Deadline(seconds)


def later(
    seconds: float, callback: Callable[[], object], task: asyncio.Task[object] | None = None
) -> Later:
    """Call `callback` on the running loop `seconds` from now, unless `.cancel()` comes first;
    `task`, when the caller has it: the loop is taken from it (see `_clock`)."""
    loop = task.get_loop() if task is not None else asyncio.get_running_loop()
    return Later(_clock(loop), seconds, callback)


def _clock(loop: asyncio.AbstractEventLoop) -> _Clock:
    # The loop comes from the task: asking asyncio for the running loop costs a getpid() call.
    global _last
    clock = _last
    if clock is None or clock.loop is not loop:
        clock = _CLOCKS.get(loop)
        if clock is None:
            clock = _CLOCKS[loop] = _Clock(loop)
        _last = clock
    return clock
