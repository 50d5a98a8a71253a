"""How much room the ledger's block may take (design D5.3), from the Turns' droppable sizes.

Rule: the block takes no more than the budget's limit less what no later step drops (the
prompts, pins, summaries and the last Turn, which fifo keeps whole), so a request that fits
without the ledger still fits with it. The Turns' droppable sizes are what fifo's cut is
worked out from too: the ledger works them out once per apply, for both.
"""

from __future__ import annotations

from typing import NamedTuple

from ..budget import Budget
from ..conversation import Conversation
from ..placement import summary_indices
from .fifo import droppable_sizes


def block_room(conversation: Conversation, budget: Budget, at: int | None) -> int:
    """The most the block may take: the limit less what no later step drops (the prompts,
    pins, summaries and the last Turn, which fifo keeps whole), so that a request that fits
    without the ledger still fits with it (design D5.3). Against the limit, not the target:
    a pass that compacts harder lowers the target, and the block must not vanish for it."""
    return room(budget, Sizes.of(conversation, at))


def room(budget: Budget, sizes: Sizes | None) -> int:
    """`block_room` from the Turns' droppable sizes."""
    return 0 if sizes is None else budget.limit - sizes.fixed - sizes.turns[-1]


class Sizes(NamedTuple):
    """The Turns' droppable sizes and what else there is beside the block (the prompts, pins,
    summaries): what `block_room` and the ledger's reach both need, worked out once per apply."""

    turns: list[int]
    fixed: int

    @staticmethod
    def of(conversation: Conversation, at: int | None) -> Sizes | None:
        turns = conversation.turns()
        if not turns:
            return None
        sizes = droppable_sizes(conversation, turns, summary_indices(conversation))
        current = conversation.messages[at].tokens if at is not None else 0
        return Sizes(sizes, conversation.tokens - sum(sizes) - current)
