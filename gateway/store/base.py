"""What every store backend offers, and the one error it may raise (design D13.1).

The rule this module keeps: a backend raises `StoreError` and nothing else; each backend maps
its client's exceptions to it in one place. Values are bytes; keys are strings chosen by the
caller, who puts the tenant in them (`gateway.store.keys` lays them out for Redis Cluster).
Expiries are seconds; None means no expiry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class StoreMetrics(Protocol):
    """What the store reports to (`ops.metrics.Metrics` has these): failed operations by kind,
    whether it answers, and whether it holds a references' key other than this process's."""

    store_errors: Any
    store_reachable: Any
    signing_key_mismatch: Any


class StoreError(Exception):
    """The backend could not do the operation (unreachable, timed out, refused)."""


@dataclass(frozen=True, slots=True)
class Lock:
    """A held lock. `shared` is False for the stand-in `SafeStore` gives while the store is down."""

    key: str
    token: str
    shared: bool = True


class Store(Protocol):
    """What every backend offers."""

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: float | None) -> None: ...

    async def put_new(self, key: str, value: bytes, ttl_s: float | None) -> bytes | None:
        """Set `key` to `value` unless it holds something (set-if-absent); return what it held
        before, None when it held nothing and now holds `value`."""
        ...

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """`get` of each key, in one round trip."""
        ...

    async def put_many(self, items: Sequence[tuple[str, bytes]], ttl_s: float | None) -> None:
        """`put` of each (key, value), in one round trip."""
        ...

    async def touch_many(self, keys: Sequence[str], ttl_s: float | None) -> list[bool]:
        """Whether each key holds a value, in one round trip; those that do get the expiry
        `ttl_s` from now (None: their expiry is left as it is)."""
        ...

    async def delete(self, key: str) -> None: ...

    async def lock(self, key: str, ttl_s: float) -> Lock | None:
        """Take the lock `key` for `ttl_s`; None if someone else holds it."""
        ...

    async def release(self, lock: Lock) -> None: ...

    async def incr(self, key: str, ttl_s: float | None) -> int:
        """Add one to the integer at `key` (missing: 0) and return it; sets the expiry if new."""
        ...

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise StoreError unless the backend answers."""
        ...

    async def reset(self) -> None:
        """Drop open connections, so that the next call opens new ones (after an outage)."""
        ...

    async def refresh(self) -> None:
        """Look again where the data lives (a Sentinel set's master): connections to a server
        that no longer holds it are dropped. Run every few seconds while the store is up."""
        ...
