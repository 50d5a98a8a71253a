"""Agents' compaction memory shared through a shared store, so that whichever replica an agent's
turn lands on decides as one process would (design D8.2, D13.3).

What decides whether an agent's compaction is answered, besides the summary and the template
(`records`), is kept per replica by `timing` and `payback`; with a shared store it is kept in
the store as well:

    seen     per conversation: its last ordinary request's history, the one before's, and
             how much it grew (`timing.Seen`), written after every ordinary request
    books    per conversation: its summaries made in this cycle, its backoff and its figures
             (`payback`), written when a summary is made and when the agent compacts
    point    per tenant and agent: where it compacts (`timing.Point`), written when it does

(The template an agent's first compaction taught is kept there as well: `share_template`.)
An ordinary request reads the three in one round trip and writes what it saw in another, both
in the background after it is prepared (the request itself never waits for the store); the
decision to make a summary follows the read. An agent's compaction request reads them before
it is judged and writes what it taught after. A conversation's keys share one hash tag
(`store.keys.conversation_key`, from the tenant, the API and the opening messages); the point's
key is the tenant's (hashed). With the store away, reads find nothing and each replica goes on
with what it remembers itself, as a single process does.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Hashable, Sequence
from typing import Any

import orjson

from ..store import SafeStore, conversation_key
from ..store.records import record
from .payback import Payback
from .records import TEMPLATE_TTL_S, Template, digest_of, template_key
from .timing import CompactionTiming, Point, Seen

log = logging.getLogger("compactgate.agent_compaction")

TTL_S = 24 * 3600  # a conversation's records outlive any pause in it
POINT_TTL_S = 7 * 24 * 3600  # where an agent compacts outlives any one session


class SharedMemory:
    """The store's copy of `timing` and `payback` (module docstring)."""

    def __init__(self, store: SafeStore, timing: CompactionTiming, payback: Payback) -> None:
        self._store = store
        self._timing = timing
        self._payback = payback

    async def load(
        self,
        tenant: str,
        api: str,
        messages: Sequence[Any],
        local: Hashable,
        agent: str | None,
    ) -> None:
        """Adopt what the store holds for this conversation (`local`: its key here) and, when
        `agent` is known, where that agent compacts."""
        keys = [self._key(tenant, api, messages, "seen"), self._key(tenant, api, messages, "books")]
        if agent is not None:
            keys.append(point_key(tenant, agent))
        values = await self._store.get_many(keys)
        seen = _seen(values[0])
        stored = record(values[1])
        books = None
        if stored is not None:  # whole numbers only: anything else under our key is not ours
            books = {
                k: v for k, v in stored.items() if isinstance(v, int) and not isinstance(v, bool)
            }
        point = _point(values[2]) if agent is not None else None
        self._timing.adopt(local, seen, (tenant, agent, point) if agent and point else None)
        if books is not None:
            self._payback.adopt(local, books)

    async def save_seen(
        self, tenant: str, api: str, messages: Sequence[Any], local: Hashable
    ) -> None:
        seen = self._timing.last(local)
        if seen is None:
            return
        value = orjson.dumps({"v": 1, "seen": [seen.history, seen.previous, seen.growth]})
        await self._store.put(self._key(tenant, api, messages, "seen"), value, TTL_S)

    async def save_books(
        self, tenant: str, api: str, messages: Sequence[Any], local: Hashable
    ) -> None:
        books = self._payback.books(local)
        if books is not None:
            value = orjson.dumps({"v": 1, **books})
            await self._store.put(self._key(tenant, api, messages, "books"), value, TTL_S)

    async def save_compaction(
        self, tenant: str, api: str, messages: Sequence[Any], local: Hashable, agent: str
    ) -> None:
        """After the agent compacted: where (its point), the books, and the conversation's
        last request forgotten (`timing.compacted` forgot it here)."""
        items: list[tuple[str, bytes]] = []
        point = self._timing.point(tenant, agent)
        if point is not None:
            fields = [point.at, point.last, point.previous, point.growth]
            items.append((point_key(tenant, agent), orjson.dumps({"v": 1, "point": fields})))
        books = self._payback.books(local)
        if books is not None:
            books_key = self._key(tenant, api, messages, "books")
            items.append((books_key, orjson.dumps({"v": 1, **books})))
        if items:
            await self._store.put_many(items, POINT_TTL_S)
        await self._store.delete(self._key(tenant, api, messages, "seen"))

    @staticmethod
    def _key(tenant: str, api: str, messages: Sequence[Any], name: str) -> str:
        opening = api + ":" + digest_of(messages[:2])
        return conversation_key(tenant, opening, "agent-" + name)


async def share_template(store: SafeStore, tenant: str, api: str, template: Template) -> None:
    """Keep the tenant's agent compaction template where every replica finds it (D8.2)."""
    try:
        await store.put(template_key(tenant, api), template.encode(), TEMPLATE_TTL_S)
    except Exception as error:  # the store being away only means no summary ahead of need
        log.warning("agent compaction template not shared: %s", error)


async def fetch_template(store: SafeStore, tenant: str, api: str) -> Template | None:
    """The template another replica learnt, if the store has it."""
    try:
        value = await store.get(template_key(tenant, api))
    except Exception as error:  # the store being away only means no summary ahead of need
        log.warning("agent compaction template lookup failed: %s", error)
        return None
    return Template.decode(value) if value is not None else None


def point_key(tenant: str, agent: str) -> str:
    digest = hashlib.blake2b(f"{tenant}\0{agent}".encode(), digest_size=20).hexdigest()
    return "agent-point:" + digest


def _ints(value: object, size: int) -> list[int | None] | None:
    if not isinstance(value, list) or len(value) != size:
        return None
    if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value):
        return None
    return value


def _seen(value: bytes | None) -> Seen | None:
    data = record(value)
    fields = _ints(data.get("seen"), 3) if data is not None else None
    if fields is None or fields[0] is None:
        return None
    return Seen(fields[0], fields[1], fields[2])


def _point(value: bytes | None) -> Point | None:
    data = record(value)
    fields = _ints(data.get("point"), 4) if data is not None else None
    if fields is None or fields[0] is None:
        return None
    return Point(fields[0], fields[1], fields[2], fields[3])
