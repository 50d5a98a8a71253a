"""Where the gateway keeps what outlives one request: summaries, tool outputs (design D13).

One interface, two backends, chosen by the `store:` URL:

    memory://[?max_bytes=N]   in-process; bounded by bytes (LRU eviction), an expiry per entry
    redis://host:port/db      shared by replicas; values with expiry (SET PX), locks with expiry
                              (SET NX PX plus a random token, released by compare-and-delete)

The rule this module keeps: **a store never fails a request.** Backends raise `StoreError`, and
only that (`_mapped` is the one place redis and socket exceptions become it). Callers use
`SafeStore`, which turns every failure into "no cache": `get` finds nothing, `put` stores
nothing, `lock` hands out a local lock (no cross-replica coordination, but the work still gets
done). Each degraded operation is counted in `compactgate_store_errors{op}`; the outage is
logged once when it starts and once when it ends. After a failure the backend is left alone
for a short, growing pause, so that requests do not each wait for a dead server's timeout.

Values are bytes; keys are strings chosen by the caller, who includes the tenant in them.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from .ops.metrics import Metrics

log = logging.getLogger("compactgate.store")

DEFAULT_MEMORY_BYTES = 64 * 1024 * 1024
ENTRY_OVERHEAD = 96  # rough bytes of bookkeeping per entry, so tiny values still count
REDIS_PREFIX = "compactgate:"
REDIS_TIMEOUT_S = 1.0  # per command; a slower Redis counts as down (the request goes on without it)
REDIS_CONNECT_TIMEOUT_S = 0.5
PAUSE_FIRST_S = 1.0
PAUSE_MAX_S = 30.0

# Deletes the lock only if it still holds our token (it may have expired and been taken since).
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


class StoreError(Exception):
    """The backend could not do the operation (unreachable, timed out, refused)."""


@dataclass(frozen=True, slots=True)
class Lock:
    """A held lock. `shared` is False for the stand-in `SafeStore` gives while the store is down."""

    key: str
    token: str
    shared: bool = True


class Store(Protocol):
    """What every backend offers. Expiries are seconds; None means no expiry."""

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: float | None) -> None: ...

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """`get` of each key, in one round trip."""
        ...

    async def put_many(self, items: Sequence[tuple[str, bytes]], ttl_s: float | None) -> None:
        """`put` of each (key, value), in one round trip."""
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
        """Raise StoreError unless the backend answers (readiness)."""


# -- memory ------------------------------------------------------------------------------------


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
    def bytes(self) -> int:
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
        self._set(key, value, None if ttl_s is None else self._clock() + ttl_s)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys]

    async def put_many(self, items: Sequence[tuple[str, bytes]], ttl_s: float | None) -> None:
        expires = None if ttl_s is None else self._clock() + ttl_s
        for key, value in items:
            self._set(key, value, expires)

    async def delete(self, key: str) -> None:
        self._remove(key)

    async def lock(self, key: str, ttl_s: float) -> Lock | None:
        now = self._clock()
        held = self._locks.get(key)
        if held is not None and held[1] > now:
            return None
        if len(self._locks) > 1024:
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
            value, expires = 1, None if ttl_s is None else self._clock() + ttl_s
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


# -- redis -------------------------------------------------------------------------------------


class RedisStore:
    """A Redis (or compatible) server shared by the replicas; keys get the `compactgate:` prefix."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: Redis | None = None

    def _redis(self) -> Redis:
        # Created on first use, inside the running event loop.
        if self._client is None:
            query = parse_qs(urlsplit(self.url).query)
            options: dict[str, object] = {"retry": Retry(NoBackoff(), 0), "retry_on_timeout": False}
            if "socket_timeout" not in query:
                options["socket_timeout"] = REDIS_TIMEOUT_S
            if "socket_connect_timeout" not in query:
                options["socket_connect_timeout"] = REDIS_CONNECT_TIMEOUT_S
            self._client = Redis.from_url(self.url, **options)
        return self._client

    async def get(self, key: str) -> bytes | None:
        with _mapped():
            return await self._redis().get(REDIS_PREFIX + key)

    async def put(self, key: str, value: bytes, ttl_s: float | None) -> None:
        with _mapped():
            await self._redis().set(REDIS_PREFIX + key, value, px=_ms(ttl_s))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        with _mapped():
            return await self._redis().mget([REDIS_PREFIX + key for key in keys])

    async def put_many(self, items: Sequence[tuple[str, bytes]], ttl_s: float | None) -> None:
        if not items:
            return
        with _mapped():
            async with self._redis().pipeline(transaction=False) as pipe:
                for key, value in items:
                    pipe.set(REDIS_PREFIX + key, value, px=_ms(ttl_s))
                await pipe.execute()

    async def delete(self, key: str) -> None:
        with _mapped():
            await self._redis().delete(REDIS_PREFIX + key)

    async def lock(self, key: str, ttl_s: float) -> Lock | None:
        token = secrets.token_hex(16)
        with _mapped():
            taken = await self._redis().set(REDIS_PREFIX + key, token, nx=True, px=_ms(ttl_s))
        return Lock(key, token) if taken else None

    async def release(self, lock: Lock) -> None:
        with _mapped():
            await self._redis().eval(_RELEASE, 1, REDIS_PREFIX + lock.key, lock.token)

    async def incr(self, key: str, ttl_s: float | None) -> int:
        with _mapped():
            async with self._redis().pipeline(transaction=True) as pipe:
                pipe.incr(REDIS_PREFIX + key)
                if ttl_s is not None:
                    pipe.pexpire(REDIS_PREFIX + key, _ms(ttl_s), nx=True)
                results = await pipe.execute()
        return int(results[0])

    async def ping(self) -> None:
        with _mapped():
            await self._redis().ping()

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(Exception):  # closing a dead connection may raise anything
                await client.aclose()


def _ms(ttl_s: float | None) -> int | None:
    return None if ttl_s is None else max(1, int(ttl_s * 1000))


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """Translate redis-py and socket failures into StoreError (the only place that does)."""
    try:
        yield
    except (RedisError, OSError, TimeoutError) as exc:
        raise StoreError(f"{type(exc).__name__}: {exc}") from None


# -- degrading wrapper -------------------------------------------------------------------------


class SafeStore:
    """A backend whose failures become "no cache", counted and logged; never raises StoreError."""

    def __init__(
        self, backend: Store, metrics: Metrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.backend = backend
        self._metrics = metrics
        self._clock = clock
        self._paused_until = 0.0
        self._pause = 0.0
        self.down = False

    async def get(self, key: str) -> bytes | None:
        if self._paused("get"):
            return None
        try:
            value = await self.backend.get(key)
        except StoreError as error:
            self._failed("get", error)
            return None
        self._ok()
        return value

    async def put(self, key: str, value: bytes, ttl_s: float | None) -> bool:
        if self._paused("put"):
            return False
        try:
            await self.backend.put(key, value, ttl_s)
        except StoreError as error:
            self._failed("put", error)
            return False
        self._ok()
        return True

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if self._paused("get"):
            return [None] * len(keys)
        try:
            values = await self.backend.get_many(keys)
        except StoreError as error:
            self._failed("get", error)
            return [None] * len(keys)
        self._ok()
        return values

    async def put_many(self, items: Sequence[tuple[str, bytes]], ttl_s: float | None) -> bool:
        if self._paused("put"):
            return False
        try:
            await self.backend.put_many(items, ttl_s)
        except StoreError as error:
            self._failed("put", error)
            return False
        self._ok()
        return True

    async def delete(self, key: str) -> bool:
        if self._paused("delete"):
            return False
        try:
            await self.backend.delete(key)
        except StoreError as error:
            self._failed("delete", error)
            return False
        self._ok()
        return True

    async def lock(self, key: str, ttl_s: float) -> Lock | None:
        """The lock, None if another holder has it, or a local stand-in while the store is down."""
        if self._paused("lock"):
            return Lock(key, "", shared=False)
        try:
            lock = await self.backend.lock(key, ttl_s)
        except StoreError as error:
            self._failed("lock", error)
            return Lock(key, "", shared=False)
        self._ok()
        return lock

    async def release(self, lock: Lock) -> None:
        if not lock.shared or self._paused("release"):
            return  # a lock we could not release expires by itself
        try:
            await self.backend.release(lock)
        except StoreError as error:
            self._failed("release", error)
            return
        self._ok()

    async def incr(self, key: str, ttl_s: float | None) -> int | None:
        if self._paused("incr"):
            return None
        try:
            value = await self.backend.incr(key, ttl_s)
        except StoreError as error:
            self._failed("incr", error)
            return None
        self._ok()
        return value

    async def close(self) -> None:
        await self.backend.close()

    async def ping(self) -> str | None:
        """None if the backend answers now, else why not (asked even during a pause: readiness
        must see the store come back; the answer updates the outage state like any call)."""
        try:
            await self.backend.ping()
        except StoreError as error:
            self._failed("ping", error)
            return str(error)
        self._ok()
        return None

    def _paused(self, op: str) -> bool:
        if self._paused_until and self._clock() < self._paused_until:
            self._metrics.store_errors.labels(op).inc()
            return True
        return False

    def _failed(self, op: str, error: StoreError) -> None:
        self._metrics.store_errors.labels(op).inc()
        self._pause = PAUSE_FIRST_S if not self.down else min(PAUSE_MAX_S, self._pause * 2)
        self._paused_until = self._clock() + self._pause
        if not self.down:
            self.down = True
            log.warning("store unavailable, running without a cache: %s failed: %s", op, error)

    def _ok(self) -> None:
        if self.down:
            self.down = False
            self._pause = 0.0
            self._paused_until = 0.0
            log.warning("store available again")


def open_store(url: str, metrics: Metrics) -> SafeStore:
    """The store for a `store:` URL (already validated by the config)."""
    if url.startswith(("redis://", "rediss://")):
        return SafeStore(RedisStore(url), metrics)
    return SafeStore(MemoryStore(memory_max_bytes(url)), metrics)


def memory_max_bytes(url: str) -> int:
    """`max_bytes` of a `memory://?max_bytes=N` URL; ValueError unless a positive integer."""
    values = parse_qs(urlsplit(url).query).get("max_bytes")
    if not values:
        return DEFAULT_MEMORY_BYTES
    try:
        size = int(values[-1])
    except ValueError:
        raise ValueError("memory://?max_bytes= must be a positive integer") from None
    if size <= 0:
        raise ValueError("memory://?max_bytes= must be a positive integer")
    return size
