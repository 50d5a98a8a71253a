"""Redis as the store shared by replicas: one server, a Sentinel set, or a Cluster (design D13.5).

    redis://             one server (`Redis.from_url`: its query options still apply)
    redis-sentinel://    the master of a Sentinel set, found through the sentinels on every new
                         connection: after a failover the next connection goes to the new master
                         (a connection to a demoted master fails on its first write and is
                         dropped)
    redis-cluster://     a Cluster, reached through its seed nodes; each command goes to its
                         key's node

The rule this module keeps: every operation touches one key, or several in a pipeline of
single-key commands (never MGET or a transaction on a cluster), so no operation spans slots
(`gateway.store.keys`); scripts take one key. Keys get the `compactgate:` prefix. A connection
error is retried once on a new connection (a server restarted since the last call is reached
at once); a timeout is not (a slow server counts as down). Failures leave as `StoreError` only,
mapped in `_mapped`.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from .base import Lock, StoreError
from .keys import PREFIX
from .urls import StoreUrl, parse_store_url

TIMEOUT_S = 1.0  # per command; a slower Redis counts as down (the request goes on without it)
CONNECT_TIMEOUT_S = 0.5

# Deletes the lock only if it still holds our token (it may have expired and been taken since).
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)
# INCR, and the expiry on the first increment only (one key: legal on a cluster).
_INCR = (
    "local n = redis.call('incr', KEYS[1]) "
    "if n == 1 and ARGV[1] ~= '' then redis.call('pexpire', KEYS[1], ARGV[1]) end return n"
)
# The value held, or nil after setting `value` (with its expiry) when there was none.
_PUT_NEW = (
    "local held = redis.call('get', KEYS[1]) if held then return held end "
    "if ARGV[2] == '' then redis.call('set', KEYS[1], ARGV[1]) "
    "else redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) end return false"
)

Client = Redis | RedisCluster


class RedisStore:
    """A Redis server, Sentinel set or Cluster shared by the replicas."""

    def __init__(self, url: str | StoreUrl) -> None:
        self.url = url if isinstance(url, StoreUrl) else parse_store_url(url)
        self._client: Client | None = None
        self._sentinel: Sentinel | None = None

    def _redis(self) -> Client:
        # Created on first use, inside the running event loop.
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _connect(self) -> Client:
        url = self.url
        timeout = url.option_float("socket_timeout") or TIMEOUT_S
        connect_timeout = url.option_float("socket_connect_timeout") or CONNECT_TIMEOUT_S
        retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        ca_certs = url.options.get("ssl_ca_certs") if url.tls else None
        if url.kind == "sentinel":
            watchers: dict[str, Any] = {
                "socket_timeout": timeout,
                "socket_connect_timeout": connect_timeout,
                "password": url.options.get("sentinel_password"),
            }
            if url.tls:
                watchers.update(ssl=True, ssl_ca_certs=ca_certs)
            self._sentinel = Sentinels(list(url.hosts), sentinel_kwargs=watchers)
            assert url.service is not None
            tls: dict[str, Any] = {"ssl": True, "ssl_ca_certs": ca_certs} if url.tls else {}
            master: Redis = self._sentinel.master_for(
                url.service,
                db=url.db,
                retry=retry,
                socket_timeout=timeout,
                socket_connect_timeout=connect_timeout,
                username=url.username,
                password=url.password,
                **tls,
            )
            return master
        if url.kind == "cluster":
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in url.hosts],
                retry=retry,
                socket_timeout=timeout,
                socket_connect_timeout=connect_timeout,
                username=url.username,
                password=url.password,
                ssl=url.tls,
                ssl_ca_certs=ca_certs,
            )
        options: dict[str, Any] = {"retry": retry}
        if url.option_float("socket_timeout") is None:
            options["socket_timeout"] = TIMEOUT_S
        if url.option_float("socket_connect_timeout") is None:
            options["socket_connect_timeout"] = CONNECT_TIMEOUT_S
        return Redis.from_url(url.url, **options)

    @property
    def _cluster(self) -> bool:
        return self.url.kind == "cluster"

    async def get(self, key: str) -> bytes | None:
        with _mapped():
            return _bytes(await self._redis().get(PREFIX + key))

    async def put(self, key: str, value: bytes, ttl_s: float | None) -> None:
        with _mapped():
            await self._redis().set(PREFIX + key, value, px=_ms(ttl_s))

    async def put_new(self, key: str, value: bytes, ttl_s: float | None) -> bytes | None:
        ttl = "" if ttl_s is None else str(_ms(ttl_s))
        with _mapped():
            held = await self._redis().eval(_PUT_NEW, 1, PREFIX + key, value, ttl)
        return _bytes(held)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        with _mapped():
            if not self._cluster:
                values = await self._redis().mget([PREFIX + key for key in keys])
            else:
                async with self._redis().pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.get(PREFIX + key)
                    values = await pipe.execute()
        return [_bytes(value) for value in values]

    async def put_many(self, items: Sequence[tuple[str, bytes]], ttl_s: float | None) -> None:
        if not items:
            return
        with _mapped():
            async with self._redis().pipeline(transaction=False) as pipe:
                for key, value in items:
                    pipe.set(PREFIX + key, value, px=_ms(ttl_s))
                await pipe.execute()

    async def touch_many(self, keys: Sequence[str], ttl_s: float | None) -> list[bool]:
        if not keys:
            return []
        with _mapped():
            async with self._redis().pipeline(transaction=False) as pipe:
                for key in keys:
                    if ttl_s is None:
                        pipe.exists(PREFIX + key)
                    else:
                        pipe.pexpire(PREFIX + key, max(1, int(ttl_s * 1000)))
                results = await pipe.execute()
        return [bool(result) for result in results]

    async def delete(self, key: str) -> None:
        with _mapped():
            await self._redis().delete(PREFIX + key)

    async def lock(self, key: str, ttl_s: float) -> Lock | None:
        token = secrets.token_hex(16)
        with _mapped():
            taken = await self._redis().set(PREFIX + key, token, nx=True, px=_ms(ttl_s))
        return Lock(key, token) if taken else None

    async def release(self, lock: Lock) -> None:
        with _mapped():
            await self._redis().eval(_RELEASE, 1, PREFIX + lock.key, lock.token)

    async def incr(self, key: str, ttl_s: float | None) -> int:
        ttl = "" if ttl_s is None else str(_ms(ttl_s))
        with _mapped():
            value = await self._redis().eval(_INCR, 1, PREFIX + key, ttl)
        return int(value)

    async def ping(self) -> None:
        """The server answers; a cluster answers on every node and says its state is ok (with
        a node away, the nodes left still answer PING while its slots fail)."""
        with _mapped():
            client = self._redis()
            await client.ping()
            if isinstance(client, RedisCluster):
                info = await client.cluster_info()
                if info.get("cluster_state") != "ok":
                    raise StoreError(f"cluster state {info.get('cluster_state')}")

    async def refresh(self) -> None:
        """Sentinel: ask the sentinels for the master again; when it has changed, the idle
        connections to the old one are closed and busy ones are closed when returned. A master
        demoted by `SENTINEL FAILOVER` takes writes until the sentinels reconfigure it (up to
        their failover timeout): writes sent there would be lost, so they stop within a check."""
        client = self._client
        if not isinstance(client, Redis):
            return
        pool = client.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            with _mapped():
                await pool.get_master_address()

    async def reset(self) -> None:
        """Close the client; the next call makes a new one (new connections, and for Sentinel
        the master asked anew)."""
        await self.close()

    async def close(self) -> None:
        client, self._client = self._client, None
        sentinel, self._sentinel = self._sentinel, None
        with contextlib.suppress(Exception):  # closing a dead connection may raise anything
            if client is not None:
                await client.aclose()
        if sentinel is not None:
            for watcher in sentinel.sentinels:
                with contextlib.suppress(Exception):
                    await watcher.aclose()


class Sentinels(Sentinel):
    """redis-py's Sentinel client, asking the master only of sentinels not in the middle of a
    failover: until it ends, the sentinel leading it still names the old master, which may
    still take writes (a forced failover leaves it a master until it is reconfigured)."""

    def check_master_state(self, state: dict[str, Any], service_name: str) -> bool:
        if "failover_in_progress" in str(state.get("flags", "")).split(","):
            return False
        return bool(super().check_master_state(state, service_name))


def _bytes(value: object) -> bytes | None:
    """A value as read back: bytes (the client never decodes), or None for a missing key."""
    return value if isinstance(value, bytes) else None


def _ms(ttl_s: float | None) -> int | None:
    return None if ttl_s is None else max(1, int(ttl_s * 1000))


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """Translate redis-py and socket failures into StoreError (the only place that does)."""
    try:
        yield
    except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
        raise StoreError(f"{type(exc).__name__}: {exc}") from None
