"""The in-process store: bounded by bytes, least recently used first out (design D13.1).

The rule this module keeps: the values held never exceed `max_bytes` (keys, values and a fixed
bookkeeping cost per entry), a value larger than the whole store is not kept, and an entry past
its expiry is never returned. Nothing is shared with other processes.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from .base import Lock
from .urls import DEFAULT_MEMORY_BYTES

ENTRY_OVERHEAD = 96  # rough bytes of bookkeeping per entry, so tiny values still count
MAX_LOCKS = 1024  # past this many, expired locks are swept


class MemoryStore:
    """In-process store: LRU by bytes, expiry per entry. Not shared between processes."""

    def __init__(
        self, max_bytes: int = DEFAULT_MEMORY_BYTES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, tuple[bytes, float | None]] = OrderedDict()
        self._bytes = 0
        self._locks: dict[str, tuple[str, float]] = {}

    @property
    def held(self) -> int:
        """Bytes held (keys, values and the bookkeeping per entry)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        entry = self._live(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    async def put(self, key: str, value: bytes, ttl_s: float | None) -> None:
        self._set(key, value, self._expiry(ttl_s))

    async def put_new(self, key: str, value: bytes, ttl_s: float | None) -> bytes | None:
        held = await self.get(key)
        if held is None:
            await self.put(key, value, ttl_s)
        return held

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys]

    async def put_many(self, items: Sequence[tuple[str, bytes]], ttl_s: float | None) -> None:
        expires = self._expiry(ttl_s)
        for key, value in items:
            self._set(key, value, expires)

    async def touch_many(self, keys: Sequence[str], ttl_s: float | None) -> list[bool]:
        found = []
        for key in keys:
            entry = self._live(key)
            if entry is not None and ttl_s is not None:
                self._entries[key] = (entry[0], self._expiry(ttl_s))
            if entry is not None:
                self._entries.move_to_end(key)
            found.append(entry is not None)
        return found

    async def delete(self, key: str) -> None:
        self._remove(key)

    async def lock(self, key: str, ttl_s: float) -> Lock | None:
        now = self._clock()
        held = self._locks.get(key)
        if held is not None and held[1] > now:
            return None
        if len(self._locks) > MAX_LOCKS:
            self._locks = {k: v for k, v in self._locks.items() if v[1] > now}
        token = secrets.token_hex(16)
        self._locks[key] = (token, now + ttl_s)
        return Lock(key, token)

    async def release(self, lock: Lock) -> None:
        held = self._locks.get(lock.key)
        if held is not None and held[0] == lock.token:
            del self._locks[lock.key]

    async def incr(self, key: str, ttl_s: float | None) -> int:
        entry = self._live(key)
        if entry is None:
            value, expires = 1, self._expiry(ttl_s)
        else:
            value, expires = int(entry[0]) + 1, entry[1]
        self._set(key, b"%d" % value, expires)
        return value

    async def close(self) -> None:
        self._entries.clear()
        self._locks.clear()
        self._bytes = 0

    async def ping(self) -> None:
        """In this process: always there."""

    async def reset(self) -> None:
        """No connections to drop."""

    async def refresh(self) -> None:
        """Always here."""

    def _expiry(self, ttl_s: float | None) -> float | None:
        return None if ttl_s is None else self._clock() + ttl_s

    def _live(self, key: str) -> tuple[bytes, float | None] | None:
        entry = self._entries.get(key)
        if entry is not None and entry[1] is not None and entry[1] <= self._clock():
            self._remove(key)
            return None
        return entry

    def _set(self, key: str, value: bytes, expires: float | None) -> None:
        self._remove(key)
        size = _size(key, value)
        if size > self.max_bytes:
            return  # larger than the whole store: not kept
        self._entries[key] = (value, expires)
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= _size(key, entry[0])


def _size(key: str, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD
