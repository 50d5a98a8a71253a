"""`compaction`: retain + summary + the last `retain_last_turns` Turns.

When the history passes `threshold_ratio` of the limit, everything after the head except the last
`retain_last_turns` Turns is replaced by a retain section and a summary: by default two user
messages put first (the `<retain>` part, when a retain prompt or directives are configured, then
the summary); `placement` can make them one system message or append them to the system prompt.
The summariser is asked (through `SummaryRequest`, the gateway makes the call, without tools) with
`summary_prompt` + `summary_directives` as bullets, `retain_prompt` + `retain_directives`, and
`model` when set. Messages go through `prepare_for_summary` (a trailing assistant message with
tool_calls loses them, or is left out when it has no text).

Never drops: the head, the last `retain_last_turns` Turns (as of each event), system/developer
and pinned messages with their tool groups, the latest user message.

Cache stability: the compacted range is a stable cut over Turns (`rollup.scan_cuts` with a target
of zero: each event compacts everything but the last Turns). Between events the
retain and summary text are the same on every request. When a new event moves the cut, the newly
covered Turns are summarised with `previous=` the earlier answer; when a retain section was asked
for, `previous` carries both, as `<retain>...</retain>` followed by `<summary>...</summary>`.
With `append_summaries` the summary text is appended to instead (`rollup`); the `<retain>`
section is the newest answer's, asked for whole each time (what is still needed from the whole
conversation is a list to replace, not to extend). It is placed before the summary, so with a
retain section configured the cache-stable prefix ends at it; placement `user` without one keeps
the whole earlier summary cached.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget
from ..conversation import Conversation
from ..placement import Placement
from ..rollup import Plan, Units
from ..summaries import SummaryAnswer
from ..summarising import SummarisingConfig, SummarisingStep, bullets

COMPACTION_PROMPT = (
    "The conversation above is getting too long for the model's context window. Write a summary "
    "that lets the work continue without it: the user's requests and goals, decisions and their "
    "reasons, facts, names, files and references that matter, errors met and how they were "
    "handled, and what is in progress or still to do. Be specific and dense; no greetings or "
    "filler. Put the summary inside <summary></summary> tags."
)
RETAIN_PROMPT = (
    "Before the summary, list inside <retain></retain> tags what must be kept word for word: "
    "identifiers, tool output references, paths, commands and exact values still needed."
)


class CompactionConfig(SummarisingConfig):
    TYPE: ClassVar[str] = "compaction"
    type: Literal["compaction"] = "compaction"
    threshold_ratio: float = Field(0.8, gt=0, le=1, description="Share of the limit")
    retain_last_turns: int = Field(1, ge=1, description="Turns at the end kept verbatim")
    summary_prompt: str = Field(COMPACTION_PROMPT, min_length=1)
    summary_directives: list[str] = Field(default_factory=list)
    retain_prompt: str | None = None
    retain_directives: list[str] = Field(default_factory=list)
    summary_tokens: int = Field(2000, ge=16, description="Longest summary asked for")
    placement: Placement = "user"

    def retain_instructions(self) -> str | None:
        if self.retain_prompt is None and not self.retain_directives:
            return None
        return bullets(self.retain_prompt or RETAIN_PROMPT, self.retain_directives)


def _previous(answer: SummaryAnswer) -> str:
    if not answer.retain.strip():
        return answer.text
    retain, text = answer.retain.strip(), answer.text.strip()
    return f"<retain>\n{retain}\n</retain>\n<summary>\n{text}\n</summary>"


class Compaction(SummarisingStep):
    type: ClassVar[str] = "compaction"
    config: CompactionConfig

    def __init__(self, config: CompactionConfig) -> None:
        instructions = bullets(config.summary_prompt, config.summary_directives)
        super().__init__(config, instructions, config.summary_tokens, config.retain_instructions())

    def plan(self, conversation: Conversation, budget: Budget) -> Plan:
        config = self.config
        keep = config.retain_last_turns
        return self._plan(
            conversation,
            budget,
            Units.of_turns(conversation.turns()),
            conversation.head_end(),
            trigger=int(budget.limit * config.threshold_ratio),
            target=-1,  # each event compacts all it may: everything but the last Turns
            cap=lambda unit: unit + 1 - keep,
            allowance=config.summary_tokens * (2 if self.retain is not None else 1),
            previous_of=_previous,
        )
