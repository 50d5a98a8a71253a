"""`gateway.deadlines.within`: the request path's deadlines, sharing one timer per loop, keep
`asyncio.timeout`'s contract, whatever order deadlines of different lengths arrive and end in.

Times are whole multiples of `UNIT` apart, so that the event loop's scheduling jitter cannot
change which of two events comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.deadlines import later, within

UNIT = 0.04  # seconds


@dataclass(frozen=True)
class Job:
    start: int  # units after the scenario starts
    deadline: int | None  # units after the block is entered; None: no deadline
    work: int  # units the block's work takes
    cancel_at: int | None  # units after the block is entered that something else cancels it

    def expected(self) -> str:
        ends = {"done": self.work}
        if self.deadline is not None:
            ends["timeout"] = self.deadline
        if self.cancel_at is not None:
            ends["cancelled"] = self.cancel_at
        return min(ends, key=lambda outcome: ends[outcome])


def _distinct(job: Job) -> bool:
    times = [t for t in (job.deadline, job.work, job.cancel_at) if t is not None]
    return len(times) == len(set(times))


jobs = st.builds(
    Job,
    start=st.integers(0, 3),
    deadline=st.none() | st.integers(1, 6),
    work=st.integers(1, 6),
    cancel_at=st.none() | st.integers(1, 6),
).filter(_distinct)


async def _run(job: Job, timeout: Callable[[float | None], object]) -> tuple[str, int]:
    """The job's outcome, and its task's cancellation count afterwards."""
    await asyncio.sleep(job.start * UNIT)
    outcome = "done"

    async def block() -> None:
        nonlocal outcome
        try:
            cm = timeout(None if job.deadline is None else job.deadline * UNIT)
            if hasattr(cm, "__aenter__"):
                async with cm:  # type: ignore[attr-defined]
                    await asyncio.sleep(job.work * UNIT)
            else:
                with cm:  # type: ignore[attr-defined]
                    await asyncio.sleep(job.work * UNIT)
        except TimeoutError:
            outcome = "timeout"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise

    task = asyncio.current_task()
    assert task is not None
    inner = asyncio.ensure_future(block())
    if job.cancel_at is not None:
        asyncio.get_running_loop().call_later(job.cancel_at * UNIT, inner.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await inner
    return outcome, inner.cancelling()


async def _scenario(batch: list[Job], timeout: Callable[[float | None], object]) -> list[object]:
    return list(await asyncio.gather(*(_run(job, timeout) for job in batch)))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(st.lists(jobs, min_size=1, max_size=5))
def test_concurrent_deadlines_expire_exactly_those_due_first(batch: list[Job]) -> None:
    """Deadlines of different lengths, entered at different times and ended by their work, by
    their deadline or by a cancellation from elsewhere: each block ends the way the earliest of
    the three says, as under `asyncio.timeout`, and leaves no cancellation pending."""
    ours = uvloop.run(_scenario(batch, within))
    theirs = uvloop.run(_scenario(batch, asyncio.timeout))
    assert [outcome for outcome, _ in ours] == [job.expected() for job in batch]
    assert ours == theirs


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_an_outer_deadline_passing_inside_an_inner_one_is_the_outer_ones(
    run: Callable[..., object],
) -> None:
    async def nested() -> list[str]:
        seen: list[str] = []
        try:
            with within(2 * UNIT):
                try:
                    with within(10 * UNIT):
                        await asyncio.sleep(5 * UNIT)
                except TimeoutError:
                    seen.append("inner")
                    raise
        except TimeoutError:
            seen.append("outer")
        with within(6 * UNIT):  # an inner deadline that passes first is the inner one's
            try:
                with within(3 * UNIT), within(1 * UNIT):
                    await asyncio.sleep(2 * UNIT)
            except TimeoutError:
                seen.append("innermost")
        task = asyncio.current_task()
        assert task is not None
        seen.append(f"cancelling={task.cancelling()}")
        return seen

    assert run(nested()) == ["outer", "innermost", "cancelling=0"]


@dataclass(frozen=True)
class Call:
    due: int  # units after the scenario starts
    cancel_at: int | None  # units after the scenario starts that it is cancelled; None: never


calls = st.builds(Call, due=st.integers(1, 6), cancel_at=st.none() | st.integers(0, 6)).filter(
    lambda call: call.cancel_at != call.due
)


async def _calls(batch: list[Call], ours: bool) -> list[int]:
    """Which calls ran, in the order they ran: by `later` or by the loop's own `call_later`,
    with a deadline on the shared timer entered and left meanwhile."""
    ran: list[int] = []
    loop = asyncio.get_running_loop()
    handles = []
    for index, call in enumerate(batch):
        callback = (lambda i: lambda: ran.append(i))(index)
        handle = (
            later(call.due * UNIT, callback) if ours else loop.call_later(call.due * UNIT, callback)
        )
        handles.append(handle)
        if call.cancel_at is not None:
            loop.call_later(call.cancel_at * UNIT, handle.cancel)
    with within(3.5 * UNIT):  # a deadline that ends by its work, sharing the timer
        await asyncio.sleep(0.5 * UNIT)
    await asyncio.sleep(7 * UNIT)
    return ran


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(calls, min_size=1, max_size=5))
def test_later_runs_exactly_the_calls_not_cancelled_in_time_as_call_later_does(
    batch: list[Call],
) -> None:
    """A call put on the shared timer runs once when it is due unless it was cancelled first,
    in the order of their due times, exactly as the loop's own timers would run them."""
    ours = uvloop.run(_calls(batch, ours=True))
    expected = [
        i
        for i, call in sorted(enumerate(batch), key=lambda pair: pair[1].due)
        if call.cancel_at is None or call.cancel_at > call.due
    ]
    assert sorted(ours) == sorted(expected)
    assert [batch[i].due for i in ours] == sorted(batch[i].due for i in ours)
    assert sorted(uvloop.run(_calls(batch, ours=False))) == sorted(ours)
