"""`prioritize_recent`: keep the recent Turns and the relevant ones.

Every Turn is scored for relevance to the latest user message (`policies.relevance`: BM25 by
default, embeddings through `Env.relevance` with `scorer: embeddings`), P1 Turns boosted by
`priority_boost`. The last `recent_bias` of the Turns are always kept; older Turns scoring under
`rel_threshold` are dropped, least relevant first, by default only until the request is under
the policy's target. Each run of dropped Turns leaves one placeholder (`policies.pruning`).

Never drops: the head, the recent Turns, Turns scoring at or over `rel_threshold`, pinned and
system/developer messages with their tool groups, the latest user message. Not cache-stable
(relevance follows the latest question): see `policies.pruning`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from ..conversation import Turn
from ..pruning import PruningConfig, PruningStep


class PrioritizeRecentConfig(PruningConfig):
    TYPE: ClassVar[str] = "prioritize_recent"
    type: Literal["prioritize_recent"] = "prioritize_recent"
    rel_threshold: float = Field(0.5, ge=0, le=1, description="Lowest relevance kept")


class PrioritizeRecent(PruningStep):
    type: ClassVar[str] = "prioritize_recent"
    config: PrioritizeRecentConfig

    def order(self, turns: Sequence[Turn], ranked: Sequence[tuple[float, int]]) -> list[int]:
        """Every Turn under `rel_threshold`, least relevant first."""
        return [index for score, index in ranked if score < self.config.rel_threshold]
