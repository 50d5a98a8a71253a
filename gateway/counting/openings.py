"""The latest request of each conversation that opens alike, for the per-conversation memos.

The memos of resent conversations (`prefix`, `wire.resent`, `wire.validated`) find a
conversation by its tenant and its opening messages. Every session of one agent opens alike:
Codex sends the same instructions and developer messages in every session of a repository, so
all the sessions of a team behind one tenant share those keys. With one request per key they
took each other's entry, turn after turn, and each request was parsed, checked and counted
again. So a key keeps the latest request of up to `PER_KEY` conversations, and a request is
matched with the one it shares the most leading messages with (the latest on a tie). The scan
is cheap: a body parse taken over from the conversation's previous body (`wire.resumed`) hands
that body's very objects on, compared by identity, and against any other conversation the
comparison stops at the first message after the shared opening.

A key keeps to half of the memo's bytes, the requests stored longest ago leaving first, so one
agent's sessions never push out every other conversation. Event loop only (not thread-safe).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from .sized_lru import SizedLru

PER_KEY = 64  # conversations kept per opening: concurrent sessions of one agent and tenant


class _Request(Protocol):
    @property
    def messages(self) -> Sequence[Any]: ...


K = TypeVar("K", bound=Hashable)
E = TypeVar("E", bound=_Request)


class OpeningSessions(Generic[K, E]):
    """Per opening key, the latest requests of the conversations that open with it."""

    def __init__(self, max_keys: int, max_bytes: int) -> None:
        # A key's one conversation is held as it is; a key with more holds them in a `_Kept`.
        self._entries: SizedLru[K, E | _Kept[E]] = SizedLru(max_keys, max_bytes)
        self._key_bytes = max_bytes // 2

    def __len__(self) -> int:
        return len(self._entries)  # keys

    @property
    def bytes(self) -> int:
        return self._entries.bytes  # the kept requests' sizes, summed

    def get(self, key: K, messages: Sequence[Any]) -> E | None:
        """The kept request of the conversation `messages` continue (see the module
        docstring); None when nothing is kept under `key`."""
        found = self._entries.get(key)
        if type(found) is _Kept:
            return found.match(messages)
        return found  # type: ignore[return-value]  # E or None: not a `_Kept`

    def put(self, key: K, entry: E, size: int, replaces: E | None = None) -> None:
        """Keep `entry` (`size` bytes) as the latest request of its conversation, in place of
        `replaces` (the request it continues) when that is still kept."""
        found = self._entries.get(key)
        if found is None or found is replaces:
            self._entries.put(key, entry, size)  # the key's one conversation, continued
            return
        if type(found) is _Kept:
            kept: _Kept[E] = found
        else:  # a second conversation under the key
            kept = _Kept()
            kept.store(found, self._entries.size_of(key), None, self._key_bytes)  # type: ignore[arg-type]
        kept.store(entry, size, replaces, self._key_bytes)
        self._entries.put(key, kept, kept.size)


class _Kept(Generic[E]):
    """The requests kept under one key, the one stored longest ago first, and their sizes."""

    __slots__ = ("entries", "size", "sizes")

    def __init__(self) -> None:
        self.entries: list[E] = []
        self.sizes: list[int] = []
        self.size = 0

    def match(self, messages: Sequence[Any]) -> E | None:
        best: E | None = None
        most = -1
        for entry in reversed(self.entries):  # the latest first: it wins a tie
            shared = shared_prefix(messages, entry.messages)
            if shared > most:
                best, most = entry, shared
        return best

    def store(self, entry: E, size: int, replaces: E | None, max_bytes: int) -> None:
        entries = self.entries
        if replaces is not None and entries and entries[-1] is replaces:
            grown = self.size - self.sizes[-1] + size
            if grown <= max_bytes:  # the latest request continued: the usual case
                entries[-1] = entry
                self.sizes[-1] = size
                self.size = grown
                return
        if replaces is not None:
            for at, kept in enumerate(self.entries):
                if kept is replaces:
                    self._drop(at)
                    break
        while self.entries and (len(self.entries) >= PER_KEY or self.size + size > max_bytes):
            self._drop(0)
        self.entries.append(entry)
        self.sizes.append(size)
        self.size += size

    def _drop(self, at: int) -> None:
        del self.entries[at]
        self.size -= self.sizes.pop(at)


def continues(same: int, previous: Sequence[Any]) -> bool:
    """Whether a request that shares `same` leading messages with the `previous` request it
    was matched with is that conversation's next one: it resends all of them, the last one
    perhaps changed (a turn sent again). Anything else is kept beside it (a short opening
    shared by another session, an edited history), never in its place."""
    return same >= len(previous) - 1


def same_objects(messages: Sequence[Any], old: Sequence[Any]) -> int:
    """How many leading messages are the very objects of `old` (not merely equal ones)."""
    different = itertools.compress(itertools.count(), map(operator.is_not, messages, old))
    return next(different, min(len(messages), len(old)))


def shared_prefix(messages: Sequence[Any], old: Sequence[Any]) -> int:
    """How many leading messages equal `old`'s (`==`): the very same objects first, then the
    rest by value, each run in C and stopping at the first difference."""
    same = same_objects(messages, old)
    rest = map(
        operator.ne, itertools.islice(messages, same, None), itertools.islice(old, same, None)
    )
    return same + next(
        itertools.compress(itertools.count(), rest), min(len(messages), len(old)) - same
    )
