"""`emergency` (design D5.9): drop the oldest half of the Turns, then more.

The last resort before recovery, used by the chain when a request is still over the limit and
by the reactive path when the upstream said the context overflowed. First it drops the oldest
`drop_ratio` of the droppable Turns (whole Turns, so tool pairs stay intact). If what is left is
still over the limit and only the current Turn remains, it keeps just the head, the pinned
messages and the latest user message, breaking Turn atomicity to avoid an overflow loop (tool
groups are still dropped whole, never split).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget
from ..conversation import Conversation, drop
from ..step import Env, StepConfig, StepResult


class EmergencyConfig(StepConfig):
    TYPE: ClassVar[str] = "emergency"
    type: Literal["emergency"] = "emergency"
    drop_ratio: float = Field(0.5, gt=0, le=1, description="Share of droppable Turns to drop")


class Emergency:
    type: ClassVar[str] = "emergency"

    def __init__(self, config: EmergencyConfig) -> None:
        self.config = config

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        if conversation.tokens <= budget.limit:
            return StepResult.unchanged(conversation, reason="fits")
        turns = conversation.turns()
        droppable = turns[:-1]
        removed = 0
        result = conversation
        if droppable:
            count = max(1, math.ceil(len(droppable) * self.config.drop_ratio))
            indices = [i for t in droppable[:count] for i in range(t.start, t.end)]
            result, removed = drop(result, indices)
        if result.tokens > budget.limit:
            latest = result.latest_user_index()
            indices = [i for i in range(result.head_end(), len(result)) if i != latest]
            result, more = drop(result, indices)
            removed += more
            if more:
                return StepResult(result, removed=removed, detail={"last_resort": True})
        return StepResult(result, removed=removed)
