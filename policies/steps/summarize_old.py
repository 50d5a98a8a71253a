"""`summarize_old`: the oldest `old_threshold` of the Turns become one summary.

When the request is over the trigger, the oldest 60 % of the Turns (rounded down to whole
Turns) are replaced by a summary of about `summary_length` tokens, a system message by default.

Never drops: the head, the newer Turns, system/developer and pinned messages with their tool
groups, the latest user message. The per-unit priority rule ("summarises non-P1 more
aggressively") is met by pinning: P1 messages a client wants verbatim are pinned, and pinned
messages are never summarised away.

Cache stability: the split is a stable cut over Turns (`rollup.scan_cuts`): at each event (the
history crossing the trigger) it moves to 60 % of the Turns seen so far, and stays there until the
next event; the summary grows by rolling extension (`previous=`), as in `sandwich`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget
from ..conversation import Conversation
from ..placement import Placement
from ..rollup import Plan, Units
from ..summarising import SummarisingConfig, SummarisingStep

SUMMARIZE_OLD_PROMPT = (
    "Summarize the older part of this conversation in about {tokens} tokens so that the rest of "
    "it still makes sense: the task, decisions, facts and names that matter, and open questions. "
    "No greetings or filler."
)


class SummarizeOldConfig(SummarisingConfig):
    TYPE: ClassVar[str] = "summarize_old"
    type: Literal["summarize_old"] = "summarize_old"
    old_threshold: float = Field(0.6, gt=0, lt=1, description="Share of Turns that is 'old'")
    summary_length: int = Field(300, ge=16, description="Target summary length in tokens")
    prompt: str = Field(SUMMARIZE_OLD_PROMPT, min_length=1, description="{tokens} is filled in")
    placement: Placement = "system"


class SummarizeOld(SummarisingStep):
    type: ClassVar[str] = "summarize_old"
    config: SummarizeOldConfig

    def __init__(self, config: SummarizeOldConfig) -> None:
        instructions = config.prompt.replace("{tokens}", str(config.summary_length))
        super().__init__(config, instructions, config.summary_length)

    def plan(self, conversation: Conversation, budget: Budget) -> Plan:
        config = self.config
        return self._plan(
            conversation,
            budget,
            Units.of_turns(conversation.turns()),
            conversation.head_end(),
            trigger=budget.trigger,
            target=-1,
            cap=lambda unit: math.floor((unit + 1) * config.old_threshold),
        )
