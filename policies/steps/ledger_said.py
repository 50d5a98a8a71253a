"""The ledger's would-be entries, worked out only as far as the cut reaches (design D5.3).

Rule: the would-be entries before a message index are the passages (line, comparison key, rank,
index) that the messages a later step may remove carry before that index, in the order said,
each statement at its first place only. A statement's first place before an index is its first
place in the whole conversation when that is before the index, so going through the messages
one by one, only as far as asked, gives exactly what going through them all and keeping those
before the index gives: the messages the cut never reaches are never split into sentences or
ranked. Each distinct text is looked up once (a chat repeats its short replies many times).

What was gone through is remembered under the uids of the messages (equal uids, equal
messages), with how far it went: a resent conversation reads it back in one lookup and goes on
from there only if its cut reaches further.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from ..conversation import Message
from ..memo import Memo
from .ledger_entries import texts_of

Candidate = tuple[str, str, float]  # (line, comparison key, rank)
Said = tuple[str, str, float, int]  # a candidate and where it was said


class Collected:
    """The would-be entries of `messages[i]` for `i` in `picked`, gone through on demand."""

    __slots__ = (
        "_count",
        "_done",
        "_find",
        "_found",
        "_key",
        "_memo",
        "_messages",
        "_picked",
        "_seen",
        "_start",
    )

    def __init__(
        self,
        messages: Sequence[Message],
        picked: Sequence[int],
        find: Callable[[tuple[str, ...]], tuple[Candidate, ...]],
        memo: Memo | None = None,
        key: Hashable = None,
    ) -> None:
        """`find` gives a message's candidates from its texts; with `memo`, what was gone
        through is remembered under `key` (which must name the picked messages exactly)."""
        self._messages, self._picked, self._find = messages, picked, find
        self._memo, self._key = memo, key
        done: tuple[Said, ...] = ()
        count = 0
        if memo is not None:
            found = memo.peek(key)
            if found is not None:
                done, count = found  # type: ignore[misc]
        # each: (line, key, rank, position in `picked`)
        self._done: list[Said] = list(done)
        self._count = self._start = count
        self._seen: set[str] | None = None  # the keys in `_done`, made when first needed
        self._found: dict[tuple[str, ...], tuple[Candidate, ...]] = {}

    def before(self, reach: int) -> list[Said]:
        """(line, key, rank, message index) of the would-be entries before index `reach`."""
        picked = self._picked
        if self._count < len(picked) and picked[self._count] < reach:
            self._extend(reach)
        out = []
        for text, key, value, k in self._done:
            i = picked[k]
            if i >= reach:
                break
            out.append((text, key, value, i))
        return out

    def remember(self) -> None:
        """Keep what was gone through for the next request with the same messages."""
        if self._memo is None or self._count == self._start:
            return
        size = 8 * len(self._picked) + sum(len(t) for t, _, _, _ in self._done)
        self._memo.replace(self._key, (tuple(self._done), self._count), size)
        self._start = self._count

    def _extend(self, reach: int) -> None:
        picked, messages, found, done = self._picked, self._messages, self._found, self._done
        seen = self._seen
        if seen is None:
            seen = self._seen = {key for _, key, _, _ in done}
        k = self._count
        while k < len(picked) and picked[k] < reach:
            texts = texts_of(messages[picked[k]])
            candidates = found.get(texts)
            if candidates is None:
                candidates = found[texts] = self._find(texts)
            for text, key, value in candidates:
                if key not in seen:
                    seen.add(key)
                    done.append((text, key, value, k))
            k += 1
        self._count = k
