"""The cut arithmetic: which units fall before the cut at each compaction event.

The rule this module owns: **the cut is a function of the conversation's prefix**. The history is
split into units (Turns, or tool-group-safe segments) and scanned from the start as if the proxy
had watched it grow (`scan_cuts`, the generalisation of `budget.stable_cut`): the cut only moves
when the running total crosses the trigger, so between events it stays where it was. Nothing here
asks for a summary; `walk` decides what the cut units are replaced by.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..conversation import PROTECTED_ROLES, Conversation, Turn, safe_cuts

Cap = Callable[[int], int]  # unit index at a crossing -> the furthest the cut may go
Settle = Callable[[int, int], int]  # (the cut so far, the cut proposed) -> the cut taken


def scan_cuts(
    sizes: Sequence[int],
    kept: Sequence[int],
    fixed: int,
    trigger: int,
    target: int,
    cap: Cap,
    allowance: int = 0,
    settle: Settle | None = None,
) -> list[int]:
    """Cut positions after each compaction event, in order; empty when nothing crossed `trigger`.

    `sizes[u]` are the tokens a unit gives up when it falls before the cut, `kept[u]` the tokens
    of it that stay anyway (anchored messages). Scanning left to right, whenever the running total
    passes `trigger`, the cut advances while the total is over `target` and the cut is below
    `cap(u)`; `allowance` (the summary that replaces the cut units) counts from the first cut on.
    With `kept` and `allowance` zero and `cap(u) = u` this is exactly `budget.stable_cut`.

    `settle`, when given, is told of every move and may take another cut than the one proposed
    (past the cut so far, at most `len(sizes)`); the scan goes on from the cut taken. `Rolling`
    uses it to keep the ranges that cached summaries already cover.
    """
    prefix = list(itertools.accumulate(sizes, initial=0))
    # added[u]: `fixed` and every unit up to u, given up or kept. Token counts are never
    # negative, so it only grows: the next unit that crosses is found by bisection, not by
    # walking the hundreds of units in between.
    added = list(itertools.accumulate(map(operator.add, sizes, kept), initial=fixed))[1:]
    cuts: list[int] = []
    cut = 0
    unit = 0
    while True:
        unit = bisect.bisect_right(added, trigger + prefix[cut] - (allowance if cut else 0), unit)
        if unit >= len(sizes):
            return cuts
        running = added[unit] - prefix[cut] + (allowance if cut else 0)
        limit = min(cap(unit), unit)  # never past the unit that crossed
        if running > target and cut < limit:
            if cut == 0:
                running += allowance  # from the first cut on, the summary takes room too
            # The first cut past this one that brings the total to `target`, or `limit`.
            proposed = bisect.bisect_left(prefix, prefix[cut] + running - target, cut + 1, limit)
            cut = proposed if settle is None else settle(cut, proposed)
            cuts.append(cut)
        unit += 1


def anchored(conversation: Conversation) -> frozenset[int]:
    """Messages no summary may replace: the client's system/developer prompts, pinned messages,
    and their whole tool groups.

    Unlike `Conversation.is_protected` this leaves out "the latest user message", which changes
    with every request; `drop` still keeps that one in the output.
    """
    messages, roles = conversation.messages, conversation.roles()
    # Found by the tuples' own (C) scans: a request has hundreds of messages, a few of them
    # prompts or pins.
    fixed = {
        i for role in PROTECTED_ROLES for i in _positions(roles, role) if messages[i].origin >= 0
    }
    pinned = list(itertools.compress(range(len(messages)), map(_PIN, messages)))
    # Prompts are never part of a tool group (only assistant and tool messages are); pinned
    # messages can be.
    if pinned:
        fixed.update(pinned)
        for group in conversation.tool_groups():
            if fixed.intersection(group):
                fixed.update(group)
    return frozenset(fixed)


_PIN = operator.attrgetter("pin")
_TOKENS = operator.attrgetter("tokens")


def _positions(values: tuple[str, ...], value: str) -> Iterator[int]:
    """Indices of `value` in `values`, in order."""
    at = -1
    while True:
        try:
            at = values.index(value, at + 1)
        except ValueError:
            return
        yield at


@dataclass(frozen=True, slots=True)
class Units:
    """Consecutive message ranges `[bounds[u], bounds[u + 1])` the scan works on."""

    bounds: tuple[int, ...]

    def __len__(self) -> int:
        return max(0, len(self.bounds) - 1)

    def indices(self, first: int, last: int) -> range:
        """Message indices of units `[first, last)`."""
        return range(self.bounds[first], self.bounds[last])

    @classmethod
    def of_turns(cls, turns: Sequence[Turn]) -> Units:
        if not turns:
            return cls(())
        return cls((*(t.start for t in turns), turns[-1].end))

    @classmethod
    def of_segments(cls, conversation: Conversation, start: int) -> Units:
        """Tool-group-safe segments of `[start, len)`: a cut between two never splits a group."""
        end = len(conversation)
        if start >= end:
            return cls(())
        return cls((start, *safe_cuts(conversation, start)))

    def after(self, bound: int) -> Units:
        """The units from `bound` (one of `bounds`) on."""
        at = self.bounds.index(bound)
        return Units(self.bounds[at:]) if at < len(self.bounds) - 1 else Units(())


def unit_sizes(
    conversation: Conversation, units: Units, fixed: frozenset[int]
) -> tuple[list[int], list[int]]:
    """(droppable tokens, anchored tokens) of every unit."""
    messages = conversation.messages
    # Tokens up to each message; a unit's tokens are the difference at its bounds. The anchored
    # messages are few (prompts, pins): they are moved from `sizes` to `kept` one by one.
    before = list(itertools.accumulate(map(_TOKENS, messages), initial=0))
    bounds = units.bounds
    at_bounds = [before[b] for b in bounds]
    sizes = list(map(operator.sub, at_bounds[1:], at_bounds))
    kept = [0] * len(sizes)
    if fixed and sizes:
        for i in fixed:
            u = bisect.bisect_right(bounds, i) - 1
            if 0 <= u < len(sizes):
                sizes[u] -= messages[i].tokens
                kept[u] += messages[i].tokens
    return sizes, kept


def chunks(first: int, last: int, sizes: Sequence[int], chunk_tokens: int) -> list[tuple[int, int]]:
    """`[first, last)` split greedily into unit ranges of at most `chunk_tokens` (or one unit)."""
    result: list[tuple[int, int]] = []
    start, total = first, 0
    for unit in range(first, last):
        if unit > start and total + sizes[unit] > chunk_tokens:
            result.append((start, unit))
            start, total = unit, 0
        total += sizes[unit]
    if start < last:
        result.append((start, last))
    return result


def links(cuts: Sequence[int], sizes: Sequence[int], chunk_tokens: int) -> list[tuple[int, int]]:
    """Unit ranges the summarised range `[0, cuts[-1])` is asked for in, one after the other.

    One link per compaction event: the units that event newly covered, `[cuts[i-1], cuts[i])`,
    split greedily into chunks of at most `chunk_tokens` when one event covers more (a long
    history seen for the first time). A function of the sizes before the last cut only, and
    `links(cuts[:k])` is a prefix of `links(cuts)`: when an event moves the cut, the earlier links
    stay as they were and one link is added, so the summary is extended with the new messages
    (one summariser call over them and the previous summary), never made again from older ones.
    """
    result: list[tuple[int, int]] = []
    first = 0
    for cut in cuts:
        result.extend(chunks(first, cut, sizes, chunk_tokens))
        first = max(first, cut)
    return result
