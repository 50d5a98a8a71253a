"""Messages already validated, remembered per conversation so that a resent history is not
checked again.

An agent resends its whole history on every turn. Each message's checks (role, content parts,
tool calls) are a pure function of its value, and a value equal (`==`) to one that passed them
passes them too: JSON values that can pass are strings, arrays, objects and null, and each is
equal only to a value of its own type. So a message equal to the one at the same place in the
caller's previous valid request of the same conversation needs no check; every other message is
checked as before, in order, so the first invalid message gives the same 400 as it always did.

Whether any remembered message carries the gateway's own field is kept too: when none did, only
the messages after the known prefix are looked at for it.

Only requests whose every message passed are remembered. Keyed by the caller (tenant) and a
digest of the opening two messages; conversations that share them (every session of one agent)
each keep their own last valid request under it (`opening_sessions`). Bounded by conversations
and by the bytes of the requests held.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..counting.opening import OpeningKey
from ..counting.openings import OpeningSessions, continues
from ..counting.prefix import equal_prefix

MAX_CONVERSATIONS = 512
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Known:
    """How many leading messages of a request are known valid, and where to remember it."""

    key: bytes | None
    count: int
    marked: bool = True  # whether those messages may carry the gateway's field (`EXTENSION`)
    previous: _Valid | None = None  # the conversation's previous valid request


@dataclass(frozen=True, slots=True)
class _Valid:
    messages: Sequence[Any]
    marked: bool


class ValidatedMessages:
    """One worker's memo of the last valid request of each conversation (event loop only)."""

    def __init__(
        self, max_conversations: int = MAX_CONVERSATIONS, max_bytes: int = MAX_BYTES
    ) -> None:
        self._entries: OpeningSessions[bytes, _Valid] = OpeningSessions(
            max_conversations, max_bytes
        )
        self._key = OpeningKey(_key)

    def known(self, scope: str, messages: Sequence[Any]) -> Known:
        """The leading messages equal to those the conversation's previous valid request had."""
        key = self._key(scope, messages)
        previous = self._entries.get(key, messages) if key is not None else None
        if previous is None:
            return Known(key, 0)
        count = equal_prefix(messages, previous.messages)
        return Known(key, count, previous.marked, previous)

    def remember(self, known: Known, messages: Sequence[Any], size: int, marked: bool) -> None:
        """Keep `messages`, all of which passed their checks (`size`: the request's bytes;
        `marked`: whether any of them carries the gateway's field), in place of the previous
        request they continue (`continues`)."""
        if known.key is None:
            return
        previous = known.previous
        continued = previous is not None and continues(known.count, previous.messages)
        self._entries.put(
            known.key, _Valid(messages, marked), size, previous if continued else None
        )


def _key(scope: str, messages: Sequence[Any]) -> bytes | None:
    digest = hashlib.sha256(scope.encode())
    for message in messages[:2]:
        try:
            digest.update(orjson.dumps(message))
        except (orjson.JSONEncodeError, TypeError):
            return None  # not remembered: every message is checked
    return digest.digest()
