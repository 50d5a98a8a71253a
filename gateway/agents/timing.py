"""When an agent will compact next: learnt from where it compacted and how fast its history grows.

An agent compacts when its history, by its own count, reaches its limit. Codex checks the
history it is about to send: its compaction request carries the last ordinary request's history
plus the step that request's answer brought. Claude Code checks the usage the upstream reported
for the last request: its compaction request carries that request's history, the prompt added.
Either way the compaction follows the ordinary request whose history was the first to reach a
level of its own, and that request is the one to summarise: its history is what the compaction
request will carry, but for at most one step.

So each compaction brackets that level, per tenant and agent (`Point`): the conversation's last
ordinary request before it had reached it (`last`), the one before that had not (`previous`).
Per conversation the gateway keeps its last two ordinary requests' histories and how much they
grew. An ordinary request whose history reaches the middle of the bracket (`mark`) is taken to
be the last before the compaction: the summary for it is due now. Without a bracket (the
compaction came first in its conversation, as a remote compaction may), the compaction's own
history stands in, less one request's growth and a `MARGIN`.

Sizes are the gateway's own count of the messages (tool definitions left out: an agent's
compaction request may carry none where its ordinary ones do). Nothing here does I/O; tables
are bounded.
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
    """Where an agent's latest compaction came: after an ordinary request of `last` tokens of
    history (the one before it had `previous`), with a history of `at` tokens."""

    at: int
    last: int | None
    previous: int | None
    growth: int | None  # how much that conversation's requests grew, as last seen

    def due(self, history: int, growth: int) -> bool:
        """Whether an ordinary request of `history` tokens, in a conversation growing by
        `growth` per request, is the last before the agent's compaction."""
        if self.last is not None and self.previous is not None and self.previous < self.last:
            return history >= (self.previous + self.last) / 2
        if self.last is not None:
            return history + growth / 2 >= self.last if growth else history >= self.last
        return history + growth >= self.at * (1 - MARGIN)


@dataclass(frozen=True, slots=True)
class Seen:
    """A conversation's last ordinary request: its history, the one before's, and how much it
    grew."""

    history: int
    previous: int | None
    growth: int | None


class CompactionTiming:
    """Per tenant and agent, where it compacts; per conversation, how it grows (see above)."""

    def __init__(self, max_kept: int = MAX_KEPT) -> None:
        self._points: OrderedDict[tuple[str, str], Point] = OrderedDict()
        self._seen: OrderedDict[Hashable, Seen] = OrderedDict()
        self._max = max_kept

    def point(self, tenant: str, agent: str) -> Point | None:
        return self._points.get((tenant, agent))

    def last(self, conversation: Hashable) -> Seen | None:
        """The conversation's last ordinary request, as `seen` recorded it."""
        return self._seen.get(conversation)

    def adopt(
        self,
        conversation: Hashable,
        seen: Seen | None,
        point: tuple[str, str, Point] | None = None,
    ) -> None:
        """Take what another replica recorded (a shared store, design D13.3): the
        conversation's last ordinary request, and where a tenant's agent compacts (tenant,
        agent, point). The latest record is the truth: a conversation's requests come one
        after the other, whichever replica each lands on."""
        if seen is not None:
            self._keep(self._seen, conversation, seen)
        if point is not None:
            self._keep(self._points, (point[0], point[1]), point[2])

    def compacted(self, tenant: str, agent: str, conversation: Hashable, history: int) -> None:
        """The agent asked to compact `conversation` at `history` tokens."""
        seen = self._seen.pop(conversation, None)
        earlier = self._points.get((tenant, agent))
        growth = seen.growth if seen is not None and seen.growth else None
        if growth is None and earlier is not None:
            growth = earlier.growth
        if seen is None:
            point = Point(history, None, None, growth)
        else:
            point = Point(history, seen.history, seen.previous, growth)
        self._keep(self._points, (tenant, agent), point)

    def seen(self, conversation: Hashable, history: int) -> None:
        """An ordinary request of `conversation` had `history` tokens."""
        last = self._seen.get(conversation)
        growth = last.growth if last is not None else None
        previous = None
        if last is not None and history > last.history:
            growth, previous = history - last.history, last.history
        self._keep(self._seen, conversation, Seen(history, previous, growth))

    def due(self, tenant: str, agent: str, conversation: Hashable, fallback: int = 0) -> bool:
        """Whether the summary for the agent's next compaction is due after the latest
        ordinary request of `conversation` (`seen`). `fallback`: where the agent compacted,
        when only another replica saw it (no bracket known here)."""
        last = self._seen.get(conversation)
        if last is None:
            return False
        point = self._points.get((tenant, agent))
        if point is None:
            if fallback <= 0:
                return False
            point = Point(fallback, None, None, None)
        return point.due(last.history, last.growth or point.growth or 0)

    def ordinary(
        self, tenant: str, agent: str, conversation: Hashable, history: int, fallback: int = 0
    ) -> bool:
        """`seen`, then `due`."""
        self.seen(conversation, history)
        return self.due(tenant, agent, conversation, fallback)

    def _keep(self, table: OrderedDict[K, V], key: K, value: V) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self._max:
            table.popitem(last=False)
