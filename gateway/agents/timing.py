"""When an agent will compact next: learnt from where it compacted and how fast its history grows.

An agent compacts when its history, by its own count, reaches its limit: right after the answer
to the ordinary request whose history, plus the step that answer brings (the model's tool call
and the tool's output), passes that limit. So each compaction request brackets the limit, per
tenant and agent (`Point`): the compaction request's history had reached it (`at`), and the
history of the conversation's ordinary request just before it had not (`below`). Per
conversation the gateway keeps its last ordinary request's history and how much the request
before it grew (`growth`; the agent's last one when the conversation has not grown yet).

After an ordinary request of `h` tokens the next request is expected at `h + growth`. When that
reaches the middle of the bracket (`mark`), the agent's next request is most likely its
compaction, and the summary for it is due now: made over this history, it leaves one step
uncovered. Without a lower end (the compaction came first in its conversation), the mark is
`MARGIN` under `at`; without any growth seen, a summary is due once `h` itself reaches the mark.

Sizes are the gateway's own count of the messages (tool definitions left out: an agent's
compaction request carries none, its ordinary ones do). Nothing here does I/O; tables are
bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeVar

MARGIN = 0.05  # the mark under a lone `at`, for counts that drift between agent and gateway
MAX_KEPT = 4096
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Point:
    """Where an agent's latest compaction came: between `below` (an ordinary request's history
    that had not reached its limit) and `at` (the compaction request's, that had)."""

    at: int
    below: int | None
    growth: int | None  # how much that conversation's requests grew, as last seen

    @property
    def mark(self) -> float:
        """The history from which the next request is taken to be the compaction."""
        if self.below is not None and 0 < self.below < self.at:
            return (self.below + self.at) / 2
        return self.at * (1 - MARGIN)


@dataclass(frozen=True, slots=True)
class Seen:
    """A conversation's last ordinary request: its history, and how much it grew."""

    history: int
    growth: int | None


class CompactionTiming:
    """Per tenant and agent, where it compacts; per conversation, how it grows (see above)."""

    def __init__(self, max_kept: int = MAX_KEPT) -> None:
        self._points: OrderedDict[tuple[str, str], Point] = OrderedDict()
        self._seen: OrderedDict[Hashable, Seen] = OrderedDict()
        self._max = max_kept

    def point(self, tenant: str, agent: str) -> Point | None:
        return self._points.get((tenant, agent))

    def compacted(self, tenant: str, agent: str, conversation: Hashable, history: int) -> None:
        """The agent asked to compact `conversation` at `history` tokens."""
        seen = self._seen.pop(conversation, None)
        earlier = self._points.get((tenant, agent))
        below = seen.history if seen is not None and seen.history < history else None
        growth = history - below if below is not None else None
        if growth is None:
            growth = seen.growth if seen is not None and seen.growth else None
        if growth is None and earlier is not None:
            growth = earlier.growth
        self._keep(self._points, (tenant, agent), Point(history, below, growth))

    def ordinary(
        self, tenant: str, agent: str, conversation: Hashable, history: int, fallback: int = 0
    ) -> bool:
        """An ordinary request of `conversation` had `history` tokens: whether the summary for
        the agent's next compaction is due now. `fallback`: where the agent compacted, when only
        another replica saw it (no bracket known here)."""
        last = self._seen.get(conversation)
        growth = last.growth if last is not None else None
        if last is not None and history > last.history:
            growth = history - last.history
        self._keep(self._seen, conversation, Seen(history, growth))
        point = self._points.get((tenant, agent))
        if point is None:
            if fallback <= 0:
                return False
            point = Point(fallback, None, None)
        if growth is None:
            growth = point.growth or 0
        return history + growth >= point.mark

    def _keep(self, table: OrderedDict[K, V], key: K, value: V) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self._max:
            table.popitem(last=False)
