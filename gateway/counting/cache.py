"""The count cache: exact token counts of messages, by a digest of each message, bounded in
memory (`CountCache`); shared by the counters of a process, personalised per tokenizer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    bytes: int
    entries: int
    evictions: int
    max_bytes: int


class CountCache:
    """A byte-bounded LRU map from 16-byte message digests to token counts; thread-safe.

    Memory is accounted per entry as `ENTRY_BYTES`: the key (a 16-byte `bytes`, 49 bytes as a
    Python object), the int (28) and the OrderedDict's slot and link node, measured with
    tracemalloc at 150-193 bytes per entry depending on the table's fill, rounded up. Counters
    only cache messages whose canonical JSON is at least `MIN_DESCRIBED_BYTES` long, so the cache
    never takes more than 2x the bytes of what it describes; smaller messages are
    re-tokenized, which costs about what hashing them would.

    `max_bytes=0` disables caching. One cache may be shared by several counters: their keys are
    personalised by tokenizer, so counts of different tokenizers never mix.
    """

    ENTRY_BYTES: Final = 208
    MIN_DESCRIBED_BYTES: Final = ENTRY_BYTES // 2

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_bytes < 0:
            raise ValueError(f"CountCache max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """Approximate memory held by the entries."""
        return len(self._entries) * self.ENTRY_BYTES

    @property
    def stats(self) -> CacheStats:
        return CacheStats(
            hits=self.hits,
            misses=self.misses,
            bytes=self.held_bytes,
            entries=len(self._entries),
            evictions=self.evictions,
            max_bytes=self.max_bytes,
        )

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> int | None:
        with self._lock:
            count = self._entries.get(key)
            if count is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return count

    def put(self, key: bytes, count: int) -> None:
        if self.max_bytes < self.ENTRY_BYTES:
            return
        with self._lock:
            self._entries[key] = count
            self._entries.move_to_end(key)
            excess = len(self._entries) - self.max_bytes // self.ENTRY_BYTES
            for _ in range(max(0, excess)):
                self._entries.popitem(last=False)
                self.evictions += 1

    def get_many(self, keys: Sequence[bytes | None]) -> list[int | None]:
        """`get` for each key under one lock; a None key is looked up as nothing (no miss)."""
        found: list[int | None] = []
        with self._lock:
            entries = self._entries
            for key in keys:
                if key is None:
                    found.append(None)
                    continue
                count = entries.get(key)
                if count is None:
                    self.misses += 1
                else:
                    entries.move_to_end(key)
                    self.hits += 1
                found.append(count)
        return found

    def put_many(self, items: Sequence[tuple[bytes, int]]) -> None:
        """`put` for each (key, count) under one lock."""
        if self.max_bytes < self.ENTRY_BYTES:
            return
        with self._lock:
            entries = self._entries
            for key, count in items:
                entries[key] = count
                entries.move_to_end(key)
            excess = len(entries) - self.max_bytes // self.ENTRY_BYTES
            for _ in range(max(0, excess)):
                entries.popitem(last=False)
                self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
