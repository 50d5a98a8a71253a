"""`sandwich`: keep the top and the bottom, replace the middle by one summary.

Over `compression_threshold` of the limit and with more than `preserve_top + preserve_bottom`
messages after the head, the messages between the first `preserve_top` (after the head) and the
last ones become one summary message, `[Earlier conversation summary: ...]` (a system message by
default, `placement` moves it). Both cut points sit on tool-group-safe boundaries: the top grows
to the end of a tool group it would split, and so does the bottom.

Never drops: the head, the top, the last `preserve_bottom` messages at the time of each event,
system/developer messages, pinned messages and their tool groups, the latest user message.

Cache stability rather than a per-request range (which would be summarised again whenever a
message is added, its summary valid only while the middle is exactly `[top, len - bottom)`): the
middle's end is a stable cut (`rollup.scan_cuts`) that only moves when the kept part crosses the
threshold again, then far enough to get back under the threshold scaled by the policy's
target/trigger share (0.7 x 0.6/0.8 = 0.525 of the limit by default), while leaving at least
`preserve_bottom` messages after it. When it moves, only the newly covered messages are
summarised, with `previous=` the summary of the old range (`rollup.Rolling`), so a cached summary
is reused as long as its range is still the middle and extended when the middle grows.
"""

from __future__ import annotations

import bisect
from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget
from ..conversation import Conversation
from ..placement import Placement
from ..rollup import Plan, Units
from ..summarising import SummarisingConfig, SummarisingStep

SANDWICH_PROMPT = (
    "Summarize this conversation excerpt concisely. Preserve:\n"
    "- Key facts and decisions made\n"
    "- Important context needed to continue the discussion\n"
    "- User preferences or requirements mentioned\n"
    "- Any commitments or action items\n"
    "\n"
    "Do not include greetings or filler. Focus on information density."
)


class SandwichConfig(SummarisingConfig):
    TYPE: ClassVar[str] = "sandwich"
    type: Literal["sandwich"] = "sandwich"
    preserve_top: int = Field(5, ge=0, description="Messages kept after the head")
    preserve_bottom: int = Field(5, ge=1, description="Messages kept at the end")
    compression_threshold: float = Field(0.7, gt=0, le=1, description="Share of the limit")
    prompt: str = Field(SANDWICH_PROMPT, min_length=1, description="Summariser instructions")
    summary_tokens: int = Field(1000, ge=16, description="Longest summary asked for")
    placement: Placement = "system"


class Sandwich(SummarisingStep):
    type: ClassVar[str] = "sandwich"
    config: SandwichConfig

    def __init__(self, config: SandwichConfig) -> None:
        super().__init__(config, config.prompt, config.summary_tokens)

    def plan(self, conversation: Conversation, budget: Budget) -> Plan | None:
        config = self.config
        head_end = conversation.head_end()
        if len(conversation) - head_end <= config.preserve_top + config.preserve_bottom:
            return None
        whole = Units.of_segments(conversation, head_end)
        # The top ends at the first safe point at or after head + preserve_top; no tool call is
        # open there, so the segments after it are the whole history's.
        wanted = head_end + config.preserve_top
        top_end = next(b for b in whole.bounds if b >= wanted)
        units = whole.after(top_end)
        bounds = units.bounds
        trigger = int(budget.limit * config.compression_threshold)

        def cap(unit: int) -> int:
            # The cut may go to the last unit start that leaves preserve_bottom messages after it,
            # counted up to the unit that crossed (a function of the prefix only).
            limit = bounds[unit + 1] - config.preserve_bottom
            return max(0, bisect.bisect_right(bounds, limit, 0, unit + 1) - 1)

        return self._plan(
            conversation,
            budget,
            units,
            top_end,
            trigger=trigger,
            target=int(trigger * min(1.0, budget.target_ratio / budget.trigger_ratio)),
            cap=cap,
        )
