"""The signing key of refs: one for every replica that shares a store, and stable (design D13.2).

Tool-output refs and the gateway's compaction items are signed with it, so equal outputs get
equal refs whichever replica served them (prompt caches keep hitting) and an item issued by
one replica verifies on another. The rule this module keeps, in order:

1. `tool_outputs.ref_secret`, when configured, is the key; the store is not asked.
2. A memory store: a key made for this process.
3. A shared store: the key held at `compactgate:ref-secret`, set once with set-if-absent, so the
   first replica to start chooses it and every later one reads it. Resolved at start-up,
   before anything that signs is built: a store still away after `STARTUP_WAIT_S` leaves this
   process with a key of its own, and a warning.

While the gateway runs, the store is checked every few seconds (`SafeStore.watch`): a key
missing (the store was emptied or restarted without its data) is written back with
set-if-absent, so a replica started after that finds the same key; a key other than this
process's is logged once (an error: refs from this replica and the others differ) and shown by
`compactgate_signing_key_mismatch`. The key in use never changes while the process runs: refs it
handed out keep verifying.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Literal

from .base import Store, StoreError, StoreMetrics
from .safe import SafeStore
from .urls import StoreUrl, parse_store_url

log = logging.getLogger("compactgate.store")

KEY = "ref-secret"  # the name every release has used: a running deployment keeps its key
STARTUP_WAIT_S = 2.0
RETRY_S = 0.2

Source = Literal["configured", "store", "created", "process"]


@dataclass(frozen=True, slots=True)
class SigningKey:
    """The key, and where it came from: configured, found in the store, created by this process
    in the store, or made for this process alone."""

    value: bytes = field(repr=False)
    source: Source


async def signing_key(
    configured: str | None, store_url: str | StoreUrl, store: SafeStore, metrics: StoreMetrics
) -> SigningKey:
    """The signing key for this process (see the module's rules); for a shared store, also
    sets the check that keeps it in the store while the process runs. Run in the event loop
    that will serve (the store connects from it)."""
    url = store_url if isinstance(store_url, StoreUrl) else parse_store_url(store_url)
    if configured:
        return SigningKey(configured.encode(), "configured")
    if not url.shared:
        return SigningKey(os.urandom(32), "process")
    key = await _shared(url, store.backend)
    store.watch(KeyCheck(key, metrics))
    return key


async def _shared(url: StoreUrl, backend: Store) -> SigningKey:
    """Read or create the shared key, trying for up to `STARTUP_WAIT_S`."""
    own = os.urandom(32).hex().encode()
    deadline = time.monotonic() + STARTUP_WAIT_S
    while True:
        try:
            held = await backend.put_new(KEY, own, None)
        except StoreError as error:
            if time.monotonic() + RETRY_S >= deadline:
                log.warning(
                    "store %s unreachable at start-up (%s): this process signs refs with a key "
                    "of its own until it can share one",
                    url.masked,
                    error,
                )
                return SigningKey(own, "process")
            await asyncio.sleep(RETRY_S)
            continue
        return SigningKey(own, "created") if held is None else SigningKey(held, "store")


class KeyCheck:
    """Keeps this process's key in the store; says so when the store holds another."""

    def __init__(self, key: SigningKey, metrics: StoreMetrics) -> None:
        self._key = key
        self._metrics = metrics
        self._differs = False

    async def __call__(self, backend: Store) -> bool:
        """True when the key was missing (written back now)."""
        held = await backend.put_new(KEY, self._key.value, None)
        if held is None:
            log.warning(
                "the signing key of refs was missing from the store (emptied, or restarted "
                "without its data): written back"
            )
        differs = held is not None and held != self._key.value
        if differs and not self._differs:
            log.error(
                "the store holds a signing key of refs other than this process's: refs and "
                "compaction items from this replica do not match the others' until it restarts"
            )
        elif self._differs and not differs:
            log.warning("the store's signing key of refs is this process's again")
        self._differs = differs
        self._metrics.signing_key_mismatch.set(1 if differs else 0)
        return held is None
