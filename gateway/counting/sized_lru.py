"""A memo bounded both by how many entries it holds and by their total size.

The per-conversation memos of a worker (token counts, validated messages, resumable parses)
each keep the latest request of up to so many conversations, but one conversation can be
megabytes: the byte bound keeps the worker's memory flat however large the requests are. The
summary answers kept in a process are bounded by bytes alone, and a read keeps one longer.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SizedLru(Generic[K, V]):
    """Entries in the order they were last stored (`by_use`: last stored or read); the oldest
    leave first when either bound is passed. An entry larger than the byte bound is not kept
    and evicts no other; the key's earlier value is dropped, so a stale value is never read."""

    def __init__(self, max_entries: int, max_bytes: int, *, by_use: bool = False) -> None:
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._by_use = by_use
        self.bytes = 0  # the stored entries' sizes, summed

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        kept = self._entries.get(key)
        if kept is None:
            return None
        if self._by_use:
            self._entries.move_to_end(key)
        return kept[0]

    def size_of(self, key: K) -> int:
        """The size `key`'s value was stored with (0 when none is)."""
        kept = self._entries.get(key)
        return 0 if kept is None else kept[1]

    def put(self, key: K, value: V, size: int) -> None:
        """Store `value` under `key` (dropping what was there), then evict the oldest."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if size > self._max_bytes:
            return
        self._entries[key] = (value, size)
        self.bytes += size
        while len(self._entries) > self._max_entries or self.bytes > self._max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
