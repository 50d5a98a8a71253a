"""Token counts of the previous request of each conversation, reused for its unchanged prefix.

A client resends the whole history every turn. Hashing every message to find its cached count
(`tokens.CountCache`) still costs about half a millisecond on a 200-message agent request; here
the previous request's message dicts are kept per conversation and compared with `==` (C-speed
string compares), so only the messages after the first difference are counted at all. Equal
dicts give equal counts, so a wrong match is impossible: two conversations that share a key
only cost each other a recount.

With the counts it keeps the roles (`Roles`): how many messages have each role and which are the
system prompt's, so the figures reported for a request forwarded as it came (messages by role,
tokens by region) are updated from the previous request's by the messages that differ, not
tallied again over the whole history.

It also gives every message a uid (`Message.uid`): a message equal to the previous request's
message at the same place keeps that message's uid, any other gets a new one. Equal uids
therefore mean equal data (equality is transitive), which lets the policies memoise work on a
run of messages (a rolling summary's link) by their uids instead of serialising them again.
uids come from one counter per `PrefixCounts` and are never reused, so they are never shared
between conversations, tenants or routes.

Bounded by conversations and by the bytes of the requests they hold; keyed by tenant, route and
the opening messages, never by Python's `hash()` of content across processes (this is a
per-process memo; the count cache below it is what workers could share). Conversations that
open alike (every session of one agent) each keep their own latest request under that key
(`opening_sessions`).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from .opening import OpeningKey
from .openings import OpeningSessions, continues, shared_prefix

MAX_CONVERSATIONS = 512
MAX_BYTES = 128 * 1024 * 1024
SYSTEM_ROLES = frozenset({"system", "developer"})  # the system prompt's messages


class MemoReport(Protocol):
    """Where a per-conversation memo reports each request's messages: how many it found
    unchanged in the conversation's previous request in this process, of how many
    (`ops.metrics.Metrics.memo`, design D13.6: a conversation kept on one replica keeps its
    memos warm)."""

    def memo(self, name: str, reused: int, messages: int) -> None: ...


@dataclass(slots=True)
class _Entry:
    tokenizer: str
    messages: Sequence[Mapping[str, Any]]
    counts: list[int]
    uids: list[int]
    roles: Roles
    bounds: list[int]  # upper bounds of the leading messages (a count stands for its own)


@dataclass(frozen=True, slots=True)
class Roles:
    """The roles of one request's messages (`role`, "" when absent), never changed once made."""

    names: list[str]
    tally: dict[str, int]  # messages per role, in the order each role first appears
    system: list[int]  # the positions of the system prompt's messages (`SYSTEM_ROLES`)

    def then(self, same: int, messages: Sequence[Mapping[str, Any]]) -> Roles:
        """The roles of `messages`, whose first `same` messages are equal to this request's:
        this tally less the messages after them, plus the new ones."""
        tally = dict(self.tally)
        for role in itertools.islice(self.names, same, None):
            left = tally[role] - 1
            if left:
                tally[role] = left
            else:
                del tally[role]  # a role seen again later first appears there
        names = self.names[:same]
        system = self.system[: bisect.bisect_left(self.system, same)]
        new = [message.get("role", "") for message in messages[same:]]
        for at, role in enumerate(new, same):
            tally[role] = tally.get(role, 0) + 1
            if role in SYSTEM_ROLES:
                system.append(at)
        names.extend(new)
        return Roles(names, tally, system)


NO_ROLES = Roles([], {}, [])


@dataclass(frozen=True, slots=True)
class Counted:
    """Per-message token counts and uids of one request, and its roles. `bounds`: the upper
    bounds of its leading messages known from the requests before (`Engine` extends the
    list, the memo's own, as it bounds the rest); `counts` may be longer or shorter."""

    counts: list[int]
    uids: list[int]
    roles: Roles
    bounds: list[int]

    def rest_bounds(
        self, messages: Sequence[Mapping[str, Any]], bound: Callable[[Mapping[str, Any]], int]
    ) -> list[int]:
        """Upper bounds (`bound`) of the messages after `counts`: those the requests before
        made, the others made now and kept for the next request (an exact count bounds itself).
        Equal messages have equal bounds, so a conversation whose late count has not landed
        yet bounds only what each request added."""
        bounds, counts = self.bounds, self.counts
        bounds.extend(counts[len(bounds) :])
        bounds.extend(map(bound, messages[len(bounds) :]))
        return bounds[len(counts) : len(messages)]


class PrefixCounts:
    def __init__(
        self,
        max_conversations: int = MAX_CONVERSATIONS,
        max_bytes: int = MAX_BYTES,
        report: MemoReport | None = None,
    ) -> None:
        self._entries: OpeningSessions[bytes, _Entry] = OpeningSessions(
            max_conversations, max_bytes
        )
        self._uids = itertools.count(1)
        self._key = OpeningKey(_key)
        self.reused = 0  # messages whose count came from the previous request
        self._report = report

    def measure(
        self,
        scope: str,
        tokenizer: str,
        messages: Sequence[Mapping[str, Any]],
        count: Callable[[Mapping[str, Any]], int],
        size: int,
    ) -> Counted:
        """Per-message counts and uids of `messages`; `size` is the request's byte size."""
        counted = self.known(scope, tokenizer, messages, size)
        counted.counts.extend(count(m) for m in messages[len(counted.counts) :])
        return counted

    def known(
        self,
        scope: str,
        tokenizer: str,
        messages: Sequence[Mapping[str, Any]],
        size: int,
    ) -> Counted:
        """The uids of `messages` and the counts the memo already knows: those of the leading
        messages equal to the previous request's (`counts` may be shorter than `messages`).

        `messages` become the conversation's latest request, and `counts` is the memo's own list:
        a caller that counts the rest extends it, and the next request reuses them.
        """
        key = self._key(scope, messages)
        entry = self._entries.get(key, messages)
        same = 0
        if entry is not None:
            same = equal_prefix(messages, entry.messages)
            uids, roles = entry.uids[:same], entry.roles.then(same, messages)
        else:
            uids, roles = [], NO_ROLES.then(0, messages)
        if entry is not None and entry.tokenizer == tokenizer:
            counts, bounds = entry.counts[:same], entry.bounds[:same]
            self.reused += len(counts)
        else:
            counts, bounds = [], []
        if self._report is not None:  # found: their uids kept, and counts once they are made
            self._report.memo("prefix_counts", same, len(messages))
        uids.extend(itertools.islice(self._uids, len(messages) - same))
        continued = entry if entry is not None and continues(same, entry.messages) else None
        entry = _Entry(tokenizer, messages, counts, uids, roles, bounds)
        self._entries.put(key, entry, size, continued)
        return Counted(counts, uids, roles, bounds)

    def peek(self, scope: str, tokenizer: str, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The counts the memo knows now for the leading messages of `messages` (a copy),
        without making `messages` the conversation's latest request."""
        entry = self._entries.get(self._key(scope, messages), messages)
        if entry is None or entry.tokenizer != tokenizer:
            return []
        return entry.counts[: equal_prefix(messages, entry.messages)]

    def fill(
        self,
        scope: str,
        tokenizer: str,
        messages: Sequence[Mapping[str, Any]],
        counts: Sequence[int],
    ) -> None:
        """Exact counts of `messages` made later (off the request path), kept for the leading
        messages the conversation's latest request here shares with `messages`.

        Under load a newer request of the conversation has usually arrived by then; the counts
        still hold for the prefix they share (equal messages have equal counts). The entry gets
        a new list: a request still counting the rest of the old one extends only its own.
        """
        entry = self._entries.get(self._key(scope, messages), messages)
        if entry is None or entry.tokenizer != tokenizer:
            return
        same = len(counts) if entry.messages is messages else equal_prefix(entry.messages, messages)
        if len(entry.counts) < same:
            entry.counts = list(counts[:same])


def equal_prefix(messages: Sequence[Any], old: Sequence[Any]) -> int:
    """How many leading messages are equal (`==`) to `old`'s, compared in C loops that stop at
    the first difference (a resend usually differs only in its last message). The very same
    objects (a parse taken over from the previous request: `wire.resumed`) are equal without
    looking inside them; such a request is tried first as the whole of `old`, or all of it but
    its last message (a resend with its last message replaced), each one list compare."""
    shared = min(len(messages), len(old))
    if shared and messages[0] is old[0]:
        if messages[:shared] == old[:shared]:
            return shared
        if messages[: shared - 1] == old[: shared - 1]:
            return shared - 1
    return shared_prefix(messages, old)


def _key(scope: str, messages: Sequence[Mapping[str, Any]]) -> bytes:
    digest = hashlib.sha256(scope.encode())
    for message in messages[:2]:
        try:
            digest.update(orjson.dumps(message))
        except orjson.JSONEncodeError:
            digest.update(repr(message).encode())
    return digest.digest()
