"""A memo for pure per-text work, owned by whoever runs the chain (never a module global).

Rule: a `Memo` only ever holds values of pure functions of their key, so a hit returns exactly
what computing again would: passing a memo, sharing one between requests or passing a fresh one
never changes an output, only how long it takes. Keys name the function first (`("detect",
text)`), so two functions never share an entry, and a value made with the `Env`'s counting or
refs carries `Env.scope` in its key (routes count differently, tenants' refs differ).

Two kinds of entry hold more than their key determines, both a rolling summary's
(`rollup.Rolling`). A `Checkpoint` holds the answers its links got from the summary source. It
is used only while the source still answers its last link, whose request carries those answers;
while it does, the output is the one a whole walk gives (tested), and after the source lost an
earlier link but not the last one, it is the summary the last link stands for, of exactly the same
messages. A conversation's recent walks (`replace`d after each) only say which checkpoints to
try: each is checked against the request before it is used, so a stale one costs time, never
output.

A client resends its whole history on every call; what a step works out from a message's text
alone (its content type, its compressed form) is the same on every request. The gateway keeps
one memo for the process and passes it in through `Env`; an `Env` made without one gets its own,
which still serves the repeated passes of one chain run. Bounded by entries and by the characters
of the texts it holds; the least recently used entries go first. Safe to share between threads
(the gateway also runs chains in a worker thread): each step is one atomic `OrderedDict`
operation, a race costs at most a recomputation, and the character count is then approximate.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")

MAX_ENTRIES = 50_000
MAX_CHARS = 32 * 1024 * 1024
_MISSING = object()


class Memo:
    """Least-recently-used results of pure functions, keyed by (function name, *arguments)."""

    __slots__ = ("_chars", "_entries", "max_chars", "max_entries")

    def __init__(self, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._entries: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def chars(self) -> int:
        """Characters of the texts the entries hold (as their callers sized them)."""
        return self._chars

    def peek(self, key: Hashable) -> object | None:
        """What was kept for `key` (marked recently used), or None; never computes."""
        found = self._entries.get(key)
        if found is None:
            return None
        try:
            self._entries.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile
            pass
        return found[0]

    def put(self, key: Hashable, value: object, chars: int = 0) -> None:
        """Keep `value` for `key` (unless one is kept already), as `get` keeps what it computes."""
        if key in self._entries:
            self.peek(key)
        else:
            self._keep(key, value, chars)

    def replace(self, key: Hashable, value: object, chars: int = 0) -> None:
        """Keep `value` for `key` instead of what was kept for it."""
        found = self._entries.pop(key, None)
        if found is not None:
            self._chars -= found[1]
        self.put(key, value, chars)

    def get(self, key: Hashable, compute: Callable[[], T], chars: int = 0) -> T:
        """`compute()`, or what it returned for an equal `key` before.

        `chars` is about how many characters the entry keeps alive (key text and value), for
        the bound; an entry larger than the whole bound is computed but not kept.
        """
        entries = self._entries
        found = entries.get(key, _MISSING)
        if found is not _MISSING:
            try:
                entries.move_to_end(key)  # most recently used last
            except KeyError:  # evicted by another thread meanwhile
                pass
            return found[0]  # type: ignore[index]
        value = compute()
        self._keep(key, value, chars)
        return value

    def _keep(self, key: Hashable, value: object, chars: int) -> None:
        entries = self._entries
        if chars <= self.max_chars and self.max_entries > 0:
            entries[key] = (value, chars)
            self._chars += chars
            while len(entries) > self.max_entries or self._chars > self.max_chars:
                try:
                    _, (_, size) = entries.popitem(last=False)
                except KeyError:
                    break
                self._chars -= size
