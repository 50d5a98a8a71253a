"""Where the gateway keeps what outlives one request: summaries, tool outputs (design D13).

One interface (`base.Store`), two backends chosen by the `store:` URL (`urls`): `memory` in
this process, `redis` shared by replicas (one server, a Sentinel set or a Cluster); callers use
`SafeStore` (`safe`), which never fails a request. `keys` lays keys out for a Cluster; `secret`
resolves the signing key of refs the replicas share.
"""

from __future__ import annotations

from .base import Lock, Store, StoreError, StoreMetrics
from .keys import conversation_key, conversation_tag
from .memory import ENTRY_OVERHEAD, MemoryStore
from .redis import RedisStore
from .safe import CHECK_S, SafeStore
from .secret import SigningKey, signing_key
from .urls import StoreUrl, mask_store_url, memory_max_bytes, parse_store_url

__all__ = [
    "ENTRY_OVERHEAD",
    "Lock",
    "MemoryStore",
    "RedisStore",
    "SafeStore",
    "SigningKey",
    "Store",
    "StoreError",
    "StoreUrl",
    "conversation_key",
    "conversation_tag",
    "mask_store_url",
    "memory_max_bytes",
    "open_store",
    "parse_store_url",
    "signing_key",
]


def open_store(
    url: str | StoreUrl, metrics: StoreMetrics, *, check_s: float = CHECK_S
) -> SafeStore:
    """The store for a `store:` URL (already validated by the config); a shared one runs its
    checks (and the replicas' sharing) every `check_s`."""
    parsed = url if isinstance(url, StoreUrl) else parse_store_url(url)
    if parsed.shared:
        return SafeStore(RedisStore(parsed), metrics, shared=True, check_s=check_s)
    return SafeStore(MemoryStore(parsed.max_bytes), metrics, shared=False)
