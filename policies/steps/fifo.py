"""`fifo` (design D5.4): drop the oldest whole Turns until the request is back under target.

Keeps: the head (system/developer), pinned messages with their tool groups, the latest user
message, the last `keep_last_turns` Turns, and the summaries an earlier step of the chain put in
(`placement.summary_indices`): a summary stands for everything before it, so fifo drops the
oldest Turns *after* it, never the summary itself (only `emergency` may, as a last resort). The
cut goes through `stable_cut`, so across a growing conversation it only moves when the kept part
crosses the trigger again (cache-stable).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget, stable_cut
from ..conversation import Conversation, Turn, drop
from ..placement import summary_indices
from ..step import Env, StepConfig, StepResult


class FifoConfig(StepConfig):
    TYPE: ClassVar[str] = "fifo"
    type: Literal["fifo"] = "fifo"
    keep_last_turns: int = Field(1, ge=1, description="Turns at the end that fifo never drops")


class Fifo:
    type: ClassVar[str] = "fifo"

    def __init__(self, config: FifoConfig) -> None:
        self.config = config

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        turns = conversation.turns()
        droppable = turns[: max(0, len(turns) - self.config.keep_last_turns)]
        if not droppable:
            return StepResult.unchanged(conversation, reason="no droppable turns")
        summaries = summary_indices(conversation)
        sizes = droppable_sizes(conversation, turns, summaries)
        fixed = conversation.tokens - sum(sizes)
        cut = min(stable_cut(sizes, fixed, budget.trigger, budget.target), len(droppable))
        if cut == 0:
            return StepResult.unchanged(conversation, reason="cut did not move")
        indices = [i for t in turns[:cut] for i in range(t.start, t.end) if i not in summaries]
        result, removed = drop(conversation, indices)
        if not removed:
            return StepResult.unchanged(conversation, reason="only kept messages in range")
        return StepResult(result, removed=removed, detail={"turns_dropped": cut})


_TOKENS = operator.attrgetter("tokens")


def droppable_sizes(
    conversation: Conversation, turns: Sequence[Turn], summaries: frozenset[int]
) -> list[int]:
    """Tokens of every Turn without its protected messages, their tool groups and summaries.

    From running totals at the Turn bounds, less the few kept messages one by one: a request has
    hundreds of messages and a handful of prompts, pins and summaries. A pinned tool call keeps
    its results (`drop` never splits a group), so they are not counted as droppable either.
    """
    messages = conversation.messages
    before = list(itertools.accumulate(map(_TOKENS, messages), initial=0))
    sizes = [before[t.end] - before[t.start] for t in turns]
    if not turns:
        return sizes
    starts = [t.start for t in turns]
    first, end = starts[0], turns[-1].end
    protected = conversation.protected()
    kept = set(itertools.compress(range(len(messages)), protected))
    roles = conversation.roles()
    if any(roles[i] in ("assistant", "tool") for i in kept):  # a pinned call or result
        for group in conversation.tool_groups():
            if any(protected[i] for i in group):
                kept.update(group)
    kept.update(summaries)
    for i in kept:
        if first <= i < end:
            sizes[bisect.bisect_right(starts, i) - 1] -= messages[i].tokens
    return sizes
