"""`discard_low_rel`: drop the least relevant `discard_percent` of the Turns.

Turns are scored as in `prioritize_recent` (relevance to the latest user message, P1 boosted);
outside the last `recent_bias` share, the lowest-scoring Turns are dropped, at most
`discard_percent` of all Turns (`ceil(n * (1 - discard_percent))` are kept), by default only
until the request is under the policy's target. Each run of dropped Turns leaves one placeholder
`[Omitted N low-relevance earlier turns]` (`policies.pruning`).

Never drops: the head, the recent Turns, pinned and system/developer messages with their tool
groups, the latest user message. Not cache-stable: see `policies.pruning`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from ..conversation import Turn
from ..pruning import PruningConfig, PruningStep


class DiscardLowRelConfig(PruningConfig):
    TYPE: ClassVar[str] = "discard_low_rel"
    type: Literal["discard_low_rel"] = "discard_low_rel"
    discard_percent: float = Field(0.3, gt=0, le=1, description="Most Turns dropped, as a share")


class DiscardLowRel(PruningStep):
    type: ClassVar[str] = "discard_low_rel"
    config: DiscardLowRelConfig

    def order(self, turns: Sequence[Turn], ranked: Sequence[tuple[float, int]]) -> list[int]:
        """The least relevant Turns, at most `discard_percent` of all of them."""
        most = len(turns) - math.ceil(round(len(turns) * (1 - self.config.discard_percent), 9))
        return [index for _, index in ranked[:most]]
