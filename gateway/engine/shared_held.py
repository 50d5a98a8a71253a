"""A conversation's latest compaction event, shared through a shared store (design D13.3), so
that the replica a turn lands on forwards what the replica that made the event would.

Between events a conversation's forwarded requests only grow by appending (`held`): each
process holds the event's result. A replica that does not hold it (the event happened on
another) would run the chain again and forward another compaction, so the store keeps where
the event was: its scope and the conversation's opening, how many of the client's messages it
compacted, a digest of them and the budget. A replica whose own held result cannot serve a
request over its trigger asks the store (one round trip, only then: a request under its
trigger, or one its own held result extends, never does), runs the chain over those same
messages with that same budget (the chain is pure: the same result), holds it, and extends it.
An event writes its record (one round trip on the request that ran the chain). Without the
store, each replica holds its own events, as a single process does.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from policies import Budget, Conversation

from ..store import SafeStore, conversation_key
from ..store.records import record

TTL_S = 24 * 3600  # an event's record outlives any pause in a conversation


class SharedEvents:
    """Where each conversation's latest compaction event was, in the store."""

    def __init__(self, store: SafeStore) -> None:
        self._store = store

    async def latest(self, scope: str, conversation: Conversation, budget: Budget) -> int | None:
        """How many of `conversation`'s messages its latest event compacted, when the store has
        one for exactly those messages and this budget; else None."""
        key = _key(scope, conversation)
        if key is None:
            return None
        data = record(await self._store.get(key))
        if data is None:
            return None
        count = data.get("n")
        if not isinstance(count, int) or not 0 < count <= len(conversation.messages):
            return None
        if data.get("budget") != _budget(budget):
            return None
        if data.get("digest") != _digest(conversation, count):
            return None
        return count

    async def made(self, scope: str, conversation: Conversation, budget: Budget) -> None:
        """An event compacted `conversation` with `budget`: any replica may extend it now."""
        key = _key(scope, conversation)
        if key is None:
            return
        count = len(conversation.messages)
        record = {"v": 1, "n": count, "digest": _digest(conversation, count)}
        record["budget"] = _budget(budget)
        await self._store.put(key, orjson.dumps(record), TTL_S)


def _key(scope: str, conversation: Conversation) -> str | None:
    if not conversation.messages:
        return None
    opening = _digest(conversation, 1)
    return conversation_key(scope, opening, "held")


def _budget(budget: Budget) -> list[Any]:
    return [
        budget.context_window,
        budget.reserved_output,
        budget.fixed_tokens,
        budget.trigger_ratio,
        budget.target_ratio,
        budget.hold_ratio,
    ]


def _digest(conversation: Conversation, count: int) -> str:
    """Of the first `count` messages' data (the same on every replica: each parses the same
    bytes into the same dicts)."""
    digest = hashlib.blake2b(digest_size=20)
    for message in conversation.messages[:count]:
        try:
            data = orjson.dumps(message.data)
        except (orjson.JSONEncodeError, TypeError):
            data = repr(message.data).encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()
