"""Whether a summary made ahead of need answers an agent's compaction request (design D8.2).

The rule this module keeps: a summary of the history's first messages is the answer, with the
uncovered tail written short after it (`tail.with_tail`), unless it covers less than
`MIN_COVERED` of the history's tokens or the tail, written short, would still be more than
`MAX_TAIL_SHARE` of them (`stale`: the agent's own call makes a better compaction). Each lookup
says why it answered or not (`Found.reason`), for the event log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..wire import WireRequest
from .tail import tail_share, with_tail

MIN_COVERED = 0.5  # the least of a compaction request's history a summary must cover
MAX_TAIL_SHARE = 0.25  # the most of it the uncovered tail, written short, may come to
READY = "ready"  # a summary made ahead of need covers the history: answered from it
NOT_READY = "not_ready"  # none was made for this history (or it is being made)
STALE = "stale"  # one was, but too much happened since: the agent's own call makes a better one
BACKOFF = "backoff"  # none was made: this conversation's summaries had not paid


@dataclass(frozen=True, slots=True)
class Found:
    """A compaction request looked up: the answer's text (None: forward it), and why."""

    text: str | None
    reason: str  # READY, NOT_READY, STALE or BACKOFF


def judged(
    request: WireRequest, counts: Sequence[int], history: int, covers: int, text: str
) -> Found:
    """A summary of the first `covers` canonical messages, as the answer for the first
    `history`: with the uncovered tail written short after it, unless the summary covers too
    little of the history or the tail is still too much of it (module docstring)."""
    if covers > history:
        return Found(None, NOT_READY)
    total = max(1, sum(counts[:history]))
    tail = request.messages[covers:history]
    uncovered = sum(counts[covers:history])
    if total - uncovered < MIN_COVERED * total:
        return Found(None, STALE)
    if uncovered * tail_share(tail) > MAX_TAIL_SHARE * total:
        return Found(None, STALE)
    return Found(with_tail(text, tail), READY)
