"""The key a per-conversation memo finds a request under, made once per conversation turn.

The memos of resent conversations (`prefix`, `wire.validated`) find a conversation by a digest
of its scope and opening messages. The opening message is usually the system prompt, often
kilobytes, and every request of a conversation would hash it again. A parse taken over from
the previous request (`wire.resumed`) hands the very same message objects to the next one;
for those objects the previous key is the answer. Parsed messages are never changed in place
(the memos' `is` shortcuts rely on that too), so the same objects always give the same key.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

K = TypeVar("K")

OPENING = 2  # messages that name a conversation


class OpeningKey(Generic[K]):
    """`make(scope, messages)`, remembered for the last scope and opening message objects."""

    __slots__ = ("_key", "_make", "_opening", "_scope")

    def __init__(self, make: Callable[[str, Sequence[Any]], K]) -> None:
        self._make = make
        self._scope: str | None = None
        self._opening: list[Any] = []  # held, so their ids cannot be reused meanwhile
        self._key: K | None = None

    def __call__(self, scope: str, messages: Sequence[Any]) -> K:
        opening = list(messages[:OPENING])
        if (
            scope == self._scope
            and len(opening) == len(self._opening)
            and all(map(operator.is_, opening, self._opening))
        ):
            return self._key  # type: ignore[return-value]  # set with `_scope`
        key = self._make(scope, messages)
        self._scope, self._opening, self._key = scope, opening, key
        return key
