"""`policies.rollup`: the event scan, links, the rolling chain, and summary input hygiene."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.budget import stable_cut
from policies.invariants import check_tool_pairs
from policies.rollup import links, scan_cuts, summary_input
from tests.policy_strategies import assistant_calls, msg, tool


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 500), max_size=40),
    fixed=st.integers(0, 300),
    trigger=st.integers(1, 3000),
    share=st.floats(0.1, 1.0),
)
def test_scan_cuts_generalises_stable_cut(
    sizes: list[int], fixed: int, trigger: int, share: float
) -> None:
    target = int(trigger * share)
    cuts = scan_cuts(sizes, [0] * len(sizes), fixed, trigger, target, lambda unit: unit)
    assert (cuts[-1] if cuts else 0) == stable_cut(sizes, fixed, trigger, target)
    assert cuts == sorted(set(cuts))
    # prefix property: the cuts of a prefix are a prefix of the cuts
    half = len(sizes) // 2
    early = scan_cuts(sizes[:half], [0] * half, fixed, trigger, target, lambda unit: unit)
    assert cuts[: len(early)] == early


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 500), min_size=1, max_size=40), chunk=st.integers(1, 2000))
def test_links_cover_the_range_and_only_the_last_changes_when_it_grows(
    sizes: list[int], chunk: int
) -> None:
    cut = len(sizes)
    chain = links(cut, sizes, chunk)
    assert chain[0][0] == 0 and chain[-1][1] == cut
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chain))
    assert all(b - a == 1 or sum(sizes[a:b]) <= chunk for a, b in chain)
    shorter = links(cut - 1, sizes, chunk) if cut > 1 else []
    assert shorter[:-1] == chain[: len(shorter) - 1]


def test_summary_input_drops_dangling_calls_anywhere() -> None:
    messages = (
        msg("user", "a"),
        assistant_calls("x1", content="calling x1"),
        msg("user", "b"),
        assistant_calls("x2", "x3"),
        tool("x3", "three"),
        tool("orphan", "no call"),
        assistant_calls("x4"),
    )
    cleaned = summary_input(messages)
    assert check_tool_pairs(cleaned) == []
    assert cleaned[1] == {"role": "assistant", "content": "calling x1"}
    assert [c["id"] for c in cleaned[3]["tool_calls"]] == ["x3"]
    assert len(cleaned) == 5
