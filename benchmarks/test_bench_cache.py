"""The prefix-stability benchmark's own measure (`python -m benchmarks.bench_cache`).

Its `ceiling` column claims no chain can extend the previous request more often than it does;
checked here against an exhaustive search over every policy. (What the gateway forwards over a
session is tested in tests/test_prefix_stability.py.)
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.bench_cache import ceiling

pytestmark = pytest.mark.property


def _best_extends(sizes: list[int], fixed: int, trigger: int) -> int:
    """Exhaustive optimum over every policy (any event may keep any size from the minimum up to
    everything), for checking that the benchmark's greedy ceiling is really a ceiling."""
    best: dict[int, int] = {sizes[0]: 0}  # size forwarded now -> most extends so far
    for before, after in itertools.pairwise(sizes):
        step = after - before
        nxt: dict[int, int] = {}
        for current, extends in best.items():
            if current + step <= trigger:  # append: the request extends the previous one
                nxt[current + step] = max(nxt.get(current + step, -1), extends + 1)
            for kept in range(fixed + step, min(current + step, trigger) + 1):  # an event
                nxt[kept] = max(nxt.get(kept, -1), extends)
        best = nxt
    return max(best.values())


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=12),
    fixed=st.integers(min_value=0, max_value=4),
    room=st.integers(min_value=9, max_value=30),
)
def test_the_benchmarks_ceiling_is_the_best_any_policy_can_do(
    steps: list[int], fixed: int, room: int
) -> None:
    """The `ceiling` column of `bench_cache` claims no chain can extend more often than it; a
    ceiling below the truth would excuse a chain that could do better."""
    sizes = list(itertools.accumulate([fixed + 1, *steps]))
    trigger = fixed + room
    assert ceiling(sizes, fixed, trigger) == _best_extends(sizes, fixed, trigger)
