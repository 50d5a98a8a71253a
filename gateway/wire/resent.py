"""Each conversation's previous parse, taken over for the messages resent as they were.

An agent resends its whole history on every turn, and turning an API's messages into the
canonical conversation (a Messages message into its tool results, text and tool calls) costs
more than anything else the gateway does on a request that fits. Here every message is
serialised (orjson, C speed) and compared, byte for byte, with the previous request of the same
conversation; the adapter resumes its parse after the longest run of leading messages that is
identical, and parses only the rest. A message that is the very object of the previous request
(its body's parse was taken over: `resumed`) is not serialised again.

Bytes, not `==`: `{"a": 1, "b": 2} == {"b": 2, "a": 1}` and `1 == 1.0 == True`, yet each of
those is different JSON, and the forwarded body is built from what was parsed. Identical bytes
parse to identical objects, so a resumed parse is exactly a parse from scratch, and the
previous objects can stand for the new ones (an equal run then compares by identity later on).

Keyed by tenant, `system` and the first message: an entry is never read for another tenant.
Conversations that share an opening (every session of one agent) each keep their own previous
request under it (`opening_sessions`). Bounded by conversations and by the bytes they hold;
event-loop only (not thread-safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..counting.openings import OpeningSessions, continues, same_objects
from ..counting.prefix import MemoReport, equal_prefix
from .resumed import ResumedBodies

MAX_CONVERSATIONS = 512
MAX_BYTES = 64 * 1024 * 1024


@dataclass(slots=True)
class _Entry:
    items: list[bytes]  # each message of the previous request, serialised
    state: Any  # the adapter's parse of them, able to resume after any leading run
    messages: Sequence[Any]  # the messages themselves, as parsed


@dataclass(frozen=True, slots=True)
class Seen:
    """A request's messages against its conversation's previous request."""

    key: tuple[str, bytes, bytes]
    items: list[bytes]
    same: int  # leading messages byte-identical to the previous request's (0 without one)
    state: Any  # the previous request's parse (None: no previous request)
    messages: Sequence[Any] = ()
    previous: _Entry | None = None  # the conversation's previous request, as kept


class ResentMessages:
    """Per conversation, the previous request's serialised messages and the adapter's parse."""

    def __init__(
        self,
        max_conversations: int = MAX_CONVERSATIONS,
        max_bytes: int = MAX_BYTES,
        report: MemoReport | None = None,
    ) -> None:
        self._entries: OpeningSessions[tuple[str, bytes, bytes], _Entry] = OpeningSessions(
            max_conversations, max_bytes
        )
        self.reused = 0  # messages whose parse was taken over
        self._report = report
        self.bodies = ResumedBodies()  # each conversation's previous body, for `load`

    def scope(self, tenant: str) -> ResentScope:
        return ResentScope(self, tenant)

    def seen(self, tenant: str, system: Any, messages: Sequence[Any]) -> Seen | None:
        """How far `messages` repeat the conversation's previous request; None when they cannot
        be serialised (nested deeper than orjson writes): then nothing is reused or kept."""
        try:
            head = orjson.dumps(system)
            first = orjson.dumps(messages[0]) if messages else b""
        except orjson.JSONEncodeError:
            return None
        key = (tenant, head, first)
        entry = self._entries.get(key, messages)
        # The very objects of the previous request (a body parse taken over: `resumed`) are
        # written as they were then.
        kept = same_objects(messages, entry.messages) if entry is not None else 0
        try:
            items = entry.items[:kept] if entry is not None else []
            items.extend(orjson.dumps(m) for m in messages[kept:])
        except orjson.JSONEncodeError:
            return None
        if entry is None:
            if self._report is not None:
                self._report.memo("resent_parse", 0, len(items))
            return Seen(key, items, 0, None, messages)
        same = equal_prefix(items, entry.items)
        self.reused += same
        if self._report is not None:
            self._report.memo("resent_parse", same, len(items))
        return Seen(key, items, same, entry.state, messages, entry)

    def keep(self, seen: Seen, state: Any) -> None:
        """Remember `state`, the adapter's parse of the request `seen` describes, in place of
        the conversation's previous request when it continues that one (`continues`)."""
        size = len(seen.key[1]) + sum(map(len, seen.items))
        previous = seen.previous
        continued = previous is not None and continues(seen.same, previous.items)
        entry = _Entry(seen.items, state, seen.messages)
        self._entries.put(seen.key, entry, size, previous if continued else None)


@dataclass(frozen=True, slots=True)
class ResentScope:
    """One tenant's view of the memo: what an adapter's `parse` is given."""

    memo: ResentMessages
    tenant: str

    def seen(self, system: Any, messages: Sequence[Any]) -> Seen | None:
        return self.memo.seen(self.tenant, system, messages)

    def keep(self, seen: Seen, state: Any) -> None:
        self.memo.keep(seen, state)

    def load(self, body: bytes, array: str) -> dict[str, Any]:
        """`body` as a JSON object (`load_object`), parsed only where it stops repeating the
        conversation's previous body (`resumed`); `array` is the field holding the history."""
        return self.memo.bodies.load(self.tenant, body, array)
