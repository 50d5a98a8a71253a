"""`summarize_old` (design D5.7): the oldest `old_threshold` of the Turns become one summary.

When the request is over the trigger, the oldest 60 % of the Turns (rounded down to whole
Turns) are replaced by a summary of about `summary_length` tokens, a system message by default.

Never drops: the head, the newer Turns, system/developer and pinned messages with their tool
groups, the latest user message. Messages a client wants kept verbatim are pinned, and pinned
messages are never summarised away.

Cache stability: the split is a stable cut over Turns (`rollup.scan_cuts`): at each event (the
history crossing the trigger) it moves to 60 % of the Turns seen so far, and stays there until the
next event; the summary grows by rolling extension (`previous=`), as in `sandwich`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field

from ..budget import Budget
from ..conversation import Conversation
from ..placement import Placement
from ..rollup import Plan, SummarisingConfig, Units, chunk_tokens, summarise
from ..step import Env, StepResult
from ..summaries import SummaryRequest

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


class SummarizeOld:
    type: ClassVar[str] = "summarize_old"

    def __init__(self, config: SummarizeOldConfig) -> None:
        self.config = config
        self.instructions = config.prompt.replace("{tokens}", str(config.summary_length))

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        config = self.config
        head_end = conversation.head_end()
        units = Units.of_turns(conversation.turns())

        def make_request(
            messages: tuple[Any, ...], previous: str | None, append: bool
        ) -> SummaryRequest:
            return SummaryRequest(
                purpose="summarize_old",
                messages=messages,
                instructions=self.instructions,
                max_tokens=config.summary_length,
                previous=previous,
                model=config.model,
                append=append,
            )

        plan = Plan(
            step_type=self.type,
            units=units,
            start=head_end,
            fixed_tokens=sum(m.tokens for m in conversation.messages[:head_end]),
            allowance=config.summary_length,
            trigger=budget.trigger,
            target=-1,
            cap=lambda unit: math.floor((unit + 1) * config.old_threshold),
            chunk_tokens=chunk_tokens(budget, config.summary_length),
            make_request=make_request,
            placement=config.placement,
            template=config.template,
            append_until=config.summary_length if config.append_summaries else None,
        )
        return summarise(conversation, plan, env)
