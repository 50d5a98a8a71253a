"""`prioritize_recent` (design D5.8): keep the recent Turns and the relevant ones.

Every Turn is scored for relevance to the latest user message (`policies.relevance`: BM25 by
default, embeddings through `Env.relevance` with `scorer: embeddings`), priority-1 Turns boosted by
`priority_boost`. The last `recent_bias` of the Turns are always kept; older Turns scoring under
`rel_threshold` are dropped, least relevant first, by default only until the request is under
the policy's target. Each run of dropped Turns leaves one placeholder (`policies.pruning`).

Never drops: the head, the recent Turns, Turns scoring at or over `rel_threshold`, pinned and
system/developer messages with their tool groups, the latest user message. Not cache-stable
(relevance follows the latest question): see `policies.pruning`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget
from ..conversation import Conversation
from ..pruning import PruningConfig, already_pruned, prune, scored_candidates
from ..step import Env, StepResult


class PrioritizeRecentConfig(PruningConfig):
    TYPE: ClassVar[str] = "prioritize_recent"
    type: Literal["prioritize_recent"] = "prioritize_recent"
    rel_threshold: float = Field(0.5, ge=0, le=1, description="Lowest relevance kept")


class PrioritizeRecent:
    type: ClassVar[str] = "prioritize_recent"

    def __init__(self, config: PrioritizeRecentConfig) -> None:
        self.config = config

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        if already_pruned(conversation, self.type):
            return StepResult.unchanged(conversation, reason="already applied")
        scored = scored_candidates(conversation, self.config, env)
        if scored is None:
            return StepResult.unchanged(conversation, reason="only recent turns")
        turns, ranked, scorer = scored
        order = [index for score, index in ranked if score < self.config.rel_threshold]
        result = prune(conversation, budget, env, self.config, self.type, turns, order)
        return StepResult(
            result.conversation,
            removed=result.removed,
            added=result.added,
            detail={**result.detail, "scorer": scorer},
        )
