"""Whether summaries made ahead of need pay for a conversation, and its figures.

A summary made ahead of need costs one upstream call over the history (`spent`: the tokens the
gateway's own call sent). It pays when the agent's compaction request is answered from it: that
request, which would have sent the whole history upstream, sends nothing (`saved`: its tokens).
It is wasted when the agent compacts later than foreseen (a newer summary replaces it), or not
at all, or its request is forwarded anyway.

Per conversation this keeps the compaction requests answered and forwarded (by reason), the
tokens spent and saved, and the summaries made but never used (`Figures`, for the event log).
A compaction request ends a cycle. A conversation whose summaries do not pay (the last
`UNUSED_IN_A_ROW` made were never used, or they have cost more than they saved by more than one
compaction request) sits out its next cycles without summaries made ahead: one, then two, four,
up to `MAX_SKIP` as long as it keeps not paying; an answer resets that. Within a cycle, at most
`MAX_PER_CYCLE` summaries are made (an agent that stopped compacting where it used to).

Nothing here does I/O; the table is bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import asdict, dataclass, fields

UNUSED_IN_A_ROW = 2
MAX_PER_CYCLE = 3
MAX_SKIP = 8
MAX_KEPT = 4096
_KEPT = ("made", "unused_in_a_row", "skip", "backoff", "lost")  # `_Books` beside its figures


@dataclass(slots=True)
class Figures:
    """One conversation's agent compactions, as the event log's agent line reports them."""

    answered: int = 0
    forwarded_not_ready: int = 0
    forwarded_stale: int = 0
    forwarded_backoff: int = 0  # sat out: its summaries had not paid
    background_tokens: int = 0  # spent: sent upstream by the gateway's own summary calls
    saved_tokens: int = 0  # the answered compaction requests' tokens, never sent upstream
    summaries_made: int = 0
    summaries_unused: int = 0


@dataclass(slots=True)
class _Books:
    figures: Figures
    made: int = 0  # summaries made in this cycle
    unused_in_a_row: int = 0
    skip: int = 0  # cycles still to sit out
    backoff: int = 0  # the length of the next sit-out
    lost: int = 0  # spent less saved since the conversation last sat out


class Payback:
    """Per conversation: what its summaries made ahead cost and saved (see above)."""

    def __init__(self, max_kept: int = MAX_KEPT) -> None:
        self._books: OrderedDict[Hashable, _Books] = OrderedDict()
        self._max = max_kept

    def may_prepare(self, conversation: Hashable) -> bool:
        """Whether a summary may be made ahead of need for `conversation` now."""
        books = self._books.get(conversation)
        return books is None or (books.skip == 0 and books.made < MAX_PER_CYCLE)

    def sitting_out(self, conversation: Hashable) -> bool:
        books = self._books.get(conversation)
        return books is not None and books.skip > 0

    def made(self, conversation: Hashable, tokens: int) -> None:
        """A summary was made for `conversation`; its call sent `tokens` upstream."""
        books = self._open(conversation)
        books.made += 1
        books.figures.summaries_made += 1
        books.figures.background_tokens += tokens
        books.lost += tokens

    def answered(self, conversation: Hashable, tokens: int) -> int:
        """The compaction request (`tokens`) was answered from a summary made ahead of need;
        how many made in this cycle went unused (all but the one that answered)."""
        books = self._open(conversation)
        unused = max(0, books.made - 1)
        books.figures.answered += 1
        books.figures.saved_tokens += tokens
        books.figures.summaries_unused += unused
        books.lost -= tokens
        books.unused_in_a_row = 0
        self._cycle_ends(books, tokens)
        if books.skip == 0:
            books.backoff = 0
        return unused

    def forwarded(self, conversation: Hashable, reason: str, tokens: int) -> int:
        """The compaction request (`tokens`) went upstream; `reason`: not_ready, stale or
        backoff. How many summaries made in this cycle went unused (all)."""
        books = self._open(conversation)
        unused = books.made
        figures = books.figures
        if reason == "stale":
            figures.forwarded_stale += 1
        elif reason == "backoff":
            figures.forwarded_backoff += 1
        else:
            figures.forwarded_not_ready += 1
        figures.summaries_unused += unused
        books.unused_in_a_row += unused
        self._cycle_ends(books, tokens)
        return unused

    def books(self, conversation: Hashable) -> dict[str, int] | None:
        """The conversation's books as plain figures (for the shared store), if any."""
        books = self._books.get(conversation)
        if books is None:
            return None
        kept = {
            k: getattr(books, k) for k in ("made", "unused_in_a_row", "skip", "backoff", "lost")
        }
        return {**kept, **asdict(books.figures)}

    def adopt(self, conversation: Hashable, figures: Mapping[str, int]) -> None:
        """Take the books another replica kept (`books`; design D13.3): the latest is the
        truth, a conversation's compactions coming one after the other. Books older than this
        replica's own are left: a read that started before this replica's last write landed
        (both run in the background) must not undo a summary it just made."""
        names = {f.name for f in fields(Figures)}
        books = _Books(Figures(**{k: int(v) for k, v in figures.items() if k in names}))
        held = self._books.get(conversation)
        if held is not None and _events(held.figures) > _events(books.figures):
            return
        for name in _KEPT:
            setattr(books, name, int(figures.get(name, 0)))
        self._books[conversation] = books
        self._books.move_to_end(conversation)
        while len(self._books) > self._max:
            self._books.popitem(last=False)

    def figures(self, conversation: Hashable) -> dict[str, int]:
        books = self._books.get(conversation)
        return asdict(books.figures) if books is not None else asdict(Figures())

    def _cycle_ends(self, books: _Books, tokens: int) -> None:
        """A compaction request (`tokens`) ended the cycle: sit the next ones out while the
        summaries do not pay."""
        books.made = 0
        if books.skip > 0:
            books.skip -= 1
            return
        if books.unused_in_a_row >= UNUSED_IN_A_ROW or books.lost > tokens:
            books.backoff = min(MAX_SKIP, max(1, books.backoff * 2))
            books.skip = books.backoff
            books.unused_in_a_row = 0
            books.lost = 0

    def _open(self, conversation: Hashable) -> _Books:
        books = self._books.get(conversation)
        if books is None:
            books = _Books(Figures())
        self._books[conversation] = books
        self._books.move_to_end(conversation)
        while len(self._books) > self._max:
            self._books.popitem(last=False)
        return books


def _events(figures: Figures) -> int:
    """How many things have happened to a conversation's books: each summary made and each
    compaction request answered or forwarded counts one, so the count only grows."""
    return (
        figures.summaries_made
        + figures.answered
        + figures.forwarded_stale
        + figures.forwarded_not_ready
        + figures.forwarded_backoff
    )
