"""`sliding_window` (design D5.5): keep the most recent Turns that fit; N follows the budget.

The window's start is a stable cut over whole Turns: it moves only when the history after it
crosses the trigger, and then far enough to get under the target, so between events every request
starts with the same messages (cache-stable). With `max_turns`, it also never keeps more than
`max_turns` Turns: when a Turn past that arrives the window jumps forward to the policy's
target/trigger share of `max_turns` (15 of 20 by default) rather than sliding one Turn per
request, which would change the prefix on every call.

Never drops: the head (system/developer), the last `keep_last_turns` Turns, pinned messages with
their tool groups, the latest user message, and a summary an earlier step put in (it stands for
the Turns before it; as in `fifo`, only `emergency` may drop one).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget, stable_cut
from ..conversation import Conversation, drop
from ..placement import summary_indices
from ..rollup import Units, anchored, scan_cuts, unit_sizes
from ..step import Env, StepConfig, StepResult


class SlidingWindowConfig(StepConfig):
    TYPE: ClassVar[str] = "sliding_window"
    type: Literal["sliding_window"] = "sliding_window"
    max_turns: int | None = Field(
        None, ge=1, description="Most Turns kept; unset: the budget decides"
    )
    keep_last_turns: int = Field(1, ge=1, description="Turns at the end never dropped")


class SlidingWindow:
    type: ClassVar[str] = "sliding_window"

    def __init__(self, config: SlidingWindowConfig) -> None:
        self.config = config

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        turns = conversation.turns()
        droppable = len(turns) - self.config.keep_last_turns
        if droppable <= 0:
            return StepResult.unchanged(conversation, reason="no droppable turns")
        units = Units.of_turns(turns)
        summaries = summary_indices(conversation)  # they stand for what came before: kept
        sizes, kept = unit_sizes(conversation, units, anchored(conversation) | summaries)
        head = sum(m.tokens for m in conversation.messages[: conversation.head_end()])
        cuts = scan_cuts(sizes, kept, head, budget.trigger, budget.target, lambda unit: unit)
        cut = cuts[-1] if cuts else 0
        if self.config.max_turns is not None and len(turns) > self.config.max_turns:
            share = min(1.0, budget.target_ratio / budget.trigger_ratio)
            keep = max(1, math.floor(self.config.max_turns * share))
            cut = max(cut, stable_cut([1] * len(turns), 0, self.config.max_turns, keep))
        cut = min(cut, droppable)
        if cut <= 0:
            return StepResult.unchanged(conversation, reason="window did not move")
        indices = [i for i in units.indices(0, cut) if i not in summaries]
        result, removed = drop(conversation, indices)
        if not removed:
            return StepResult.unchanged(conversation, reason="only protected messages in range")
        return StepResult(result, removed=removed, detail={"turns_dropped": cut})
