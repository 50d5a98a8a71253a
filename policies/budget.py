"""How many tokens the messages may use, and where a stable cut goes (design D2, D3.1).

`Budget.limit` is what the messages may take: the context window minus the output reserve and
the fixed cost of everything that is not a message (tool definitions, reply priming, a safety
margin). Compaction starts when the messages pass `trigger` and aims for `target`.

`stable_cut` is the rule that keeps compaction cache-friendly. A client resends its whole history
on every call, so a naive "drop the oldest until under target" moves the cut one message further
on every request and the provider's prompt cache never hits. `stable_cut` instead scans the
history from the start as if it had watched the conversation grow: the cut only moves when the
part after it crosses `trigger`, and then it jumps far enough to get under `target`. The cut is a
function of the prefix alone, so appending messages never moves an earlier decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Budget:
    """Token budget for the messages of one request."""

    context_window: int
    reserved_output: int
    fixed_tokens: int = 0  # tool definitions, reply priming, safety margin
    trigger_ratio: float = 0.8
    target_ratio: float = 0.6
    hold_ratio: float = 0.95  # how far appended turns may grow a compaction event's result (D3.3)
    event_pass: bool = False  # made by `at_event`: the second pass of an event

    @property
    def limit(self) -> int:
        """The most tokens the messages may take and still fit."""
        return self.context_window - self.reserved_output - self.fixed_tokens

    @property
    def trigger(self) -> int:
        return int(self.limit * self.trigger_ratio)

    @property
    def target(self) -> int:
        return int(self.limit * self.target_ratio)

    @property
    def hold(self) -> int:
        """After an event, the turns appended to its result go as they are up to here."""
        return int(self.limit * max(self.hold_ratio, self.trigger_ratio))

    def at_event(self) -> Budget:
        """A budget one band lower: its trigger is this target, its target as far below.

        For a compaction event that the steps' first pass left between target and trigger (say
        masking was not enough): a second pass with this budget takes it to the target, and its
        stable cuts keep the same width of band, so they still only move now and then.
        """
        band = max(0.0, self.trigger_ratio - self.target_ratio)
        return Budget(
            context_window=self.context_window,
            reserved_output=self.reserved_output,
            fixed_tokens=self.fixed_tokens,
            trigger_ratio=self.target_ratio,
            target_ratio=max(0.0, self.target_ratio - band),
            hold_ratio=self.hold_ratio,
            event_pass=True,
        )

    def tighter(self, context_window: int) -> Budget:
        """The same budget against a smaller window (reactive path: the upstream told us)."""
        return Budget(
            context_window=min(self.context_window, context_window),
            reserved_output=self.reserved_output,
            fixed_tokens=self.fixed_tokens,
            trigger_ratio=self.trigger_ratio,
            target_ratio=self.target_ratio,
            hold_ratio=self.hold_ratio,
        )


def stable_cut(unit_tokens: Sequence[int], fixed: int, trigger: int, target: int) -> int:
    """Index of the first unit to keep, chosen so that it only moves at compaction events.

    `unit_tokens` are the sizes of the droppable units in order (Turns, tool outputs, ...),
    `fixed` what is always kept (head, pinned, latest user message). Scanning left to right,
    whenever fixed + units[cut..i] passes `trigger`, the cut advances until the kept part is at or
    under `target` (never past unit i, so the newest unit is not dropped by this rule).
    """
    cut = 0
    running = fixed
    for i, size in enumerate(unit_tokens):
        running += size
        if running > trigger:
            while cut < i and running > target:
                running -= unit_tokens[cut]
                cut += 1
    return cut
