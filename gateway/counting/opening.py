"""The key a per-conversation memo finds a request under, made once per conversation turn.

The memos of resent conversations (`prefix`, `wire.validated`) find a conversation by a digest
of its scope and opening messages. The opening message is usually the system prompt, often
kilobytes, and every request of a conversation would hash it again. A parse taken over from
the previous request (`wire.resumed`) hands the very same message objects to the next one;
for those objects the previous key is the answer. Parsed messages are never changed in place
(the memos' `is` shortcuts rely on that too), so the same objects always give the same key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

K = TypeVar("K")

_ABSENT = object()  # no message at that place


class OpeningKey(Generic[K]):
    """`make(scope, messages)`, remembered for the last scope and opening message objects."""

    __slots__ = ("_first", "_key", "_make", "_scope", "_second")

    def __init__(self, make: Callable[[str, Sequence[Any]], K]) -> None:
        self._make = make
        self._scope: str | None = None
        # held, so their ids cannot be reused meanwhile
        self._first: Any = _ABSENT
        self._second: Any = _ABSENT
        self._key: K | None = None

    def __call__(self, scope: str, messages: Sequence[Any]) -> K:
        first = messages[0] if messages else _ABSENT
        second = messages[1] if len(messages) > 1 else _ABSENT
        if first is self._first and second is self._second and scope == self._scope:
            return self._key  # type: ignore[return-value]  # set with `_scope`
        key = self._make(scope, messages)
        self._scope, self._first, self._second, self._key = scope, first, second, key
        return key
