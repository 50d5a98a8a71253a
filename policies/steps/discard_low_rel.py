"""`discard_low_rel` (design D5.8): drop the least relevant `discard_percent` of the Turns.

Turns are scored as in `prioritize_recent` (relevance to the latest question, priority 1 boosted);
outside the last `recent_bias` share, the lowest-scoring Turns are dropped, at most
`discard_percent` of all Turns (it keeps `ceil(n * (1 - discard_percent))`), by default only
until the request is under the policy's target. Each run of dropped Turns leaves one placeholder
`[Omitted N low-relevance earlier turns]` (`policies.pruning`).

Never drops: the head, the recent Turns, pinned and system/developer messages with their tool
groups, the latest user message. Not cache-stable: see `policies.pruning`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget
from ..conversation import Conversation
from ..pruning import PruningConfig, already_pruned, prune, scored_candidates
from ..step import Env, StepResult


class DiscardLowRelConfig(PruningConfig):
    TYPE: ClassVar[str] = "discard_low_rel"
    type: Literal["discard_low_rel"] = "discard_low_rel"
    discard_percent: float = Field(0.3, gt=0, le=1, description="Most Turns dropped, as a share")


class DiscardLowRel:
    type: ClassVar[str] = "discard_low_rel"

    def __init__(self, config: DiscardLowRelConfig) -> None:
        self.config = config

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        if already_pruned(conversation, self.type):
            return StepResult.unchanged(conversation, reason="already applied")
        scored = scored_candidates(conversation, self.config, env)
        if scored is None:
            return StepResult.unchanged(conversation, reason="only recent turns")
        turns, ranked, scorer = scored
        most = len(turns) - math.ceil(round(len(turns) * (1 - self.config.discard_percent), 9))
        order = [index for _, index in ranked[:most]]
        result = prune(conversation, budget, env, self.config, self.type, turns, order)
        return StepResult(
            result.conversation,
            removed=result.removed,
            added=result.added,
            detail={**result.detail, "scorer": scorer},
        )
