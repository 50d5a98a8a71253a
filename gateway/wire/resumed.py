"""A resent body parsed from where it stops repeating the conversation's previous body.

An agent resends its whole history on every turn: most of a 200 KB body is byte for byte the
previous request's. Here the previous body of a conversation is kept with its parse and where
each element of its message array ends; a new body is compared with it (memcmp), the elements
that lie wholly in the common prefix are taken over as they were parsed, and only the rest of
the body (the new messages and the fields after the array) is parsed.

The result is accepted only when the body is, byte for byte, what orjson writes for it: the
kept prefix was verified so when it was stored, and the new part is written again and compared.
orjson reads what it writes back to the same values, types and key order, so an accepted result
is exactly `orjson.loads(body)`, whatever the edit (a changed earlier message, other key order
or whitespace, a duplicate key, fields after the array). Anything else (a body written with
spaces, escapes orjson does not make, invalid JSON) is parsed whole, as before.

Keyed by tenant, the array's field and the body's opening bytes. Conversations that open alike
(every session of one agent: the same instructions and tools, tens of kilobytes) share a key,
so a key keeps many bodies, sorted by their bytes: the kept body that shares the longest prefix
with a new one is next to where the new one would be inserted (a body sharing more with the new
one sorts between them), so finding it is a binary search of memcmp calls, however many
sessions run at once. Bounded by keys, bodies per key and the bytes of the bodies held;
event-loop only (not thread-safe). Parsed values are shared with the next request's parse:
nothing on the request path changes a parsed body in place.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import orjson

from ..counting.sized_lru import SizedLru
from .fields import load_object

MAX_KEYS = 512
MAX_BYTES = 64 * 1024 * 1024
# Bodies kept per key: concurrent sessions of one agent and tenant (their bodies open alike).
# A key also keeps to half of the memo's bytes, so that one key never pushes out all the others
# (or, grown past the bound, is dropped whole).
PER_KEY = 256
KEY_BYTES = 256  # the opening bytes that pick the candidates
# A body smaller than this is parsed whole: orjson reads it in about the time a resume takes.
MIN_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class _Layout:
    """A body that is exactly orjson's writing of its parse, and where its array's elements
    end: `ends[i]` is the offset just after element i (`start` just after the `[`)."""

    body: bytes
    head: dict[str, Any]  # the fields before the array
    start: int
    items: list[Any]
    ends: list[int]
    rest: dict[str, Any]  # the fields after the array
    tail: bytes  # how the body ends after the array's `]`: `rest` as orjson writes it


class ResumedBodies:
    """Per conversation, the latest bodies with their parses (see the module docstring)."""

    def __init__(
        self, max_keys: int = MAX_KEYS, max_bytes: int = MAX_BYTES, min_bytes: int = MIN_BYTES
    ) -> None:
        self._min_bytes = min_bytes
        self._max_bytes = max_bytes
        self._entries: SizedLru[tuple[str, str, bytes], _Kept] = SizedLru(max_keys, max_bytes)
        self.reused = 0  # array elements taken over from a previous parse

    def load(self, tenant: str, body: bytes, array: str) -> dict[str, Any]:
        """`body` as a JSON object, exactly `load_object(body)` (the same 400 when it is not
        one), reusing the parse of the previous body of its conversation; `array` names the
        field that holds the conversation (`messages`, `input`)."""
        if len(body) < self._min_bytes:
            return load_object(body)
        key = (tenant, array, body[:KEY_BYTES])
        kept = self._entries.get(key)
        best, reused = kept.closest(body) if kept is not None else (None, 0)
        found = _resume(best, reused, body, array) if best is not None else None
        if found is None:
            payload = load_object(body)
            layout = _layout(body, payload, array)
        else:
            payload, layout = found
            self.reused += reused
        if layout is not None:
            # The body replaces the one it continued; one that shares less is a conversation
            # of its own, kept beside the others.
            same = best is not None and 2 * reused >= len(best.items)
            kept = kept if kept is not None else _Kept()
            kept.keep(layout, best if same else None, self._max_bytes // 2)
            self._entries.put(key, kept, kept.size)
        return payload


class _Kept:
    """The bodies kept under one key, in the order of their bytes, and when each was stored."""

    __slots__ = ("_clock", "bodies", "layouts", "size", "stamps")

    def __init__(self) -> None:
        self.bodies: list[bytes] = []  # sorted
        self.layouts: list[_Layout] = []  # `bodies`' layouts, in the same order
        self.stamps: list[int] = []  # when each was stored: the oldest leaves first
        self.size = 0  # the bodies' bytes
        self._clock = 0

    def closest(self, body: bytes) -> tuple[_Layout | None, int]:
        """The kept body sharing the most whole array elements with `body`, and how many: one
        of the two that `body` sorts between shares the longest prefix with it."""
        at = bisect.bisect_left(self.bodies, body)
        return _closest(self.layouts[max(at - 1, 0) : at + 1], body)

    def keep(self, layout: _Layout, replaced: _Layout | None, max_bytes: int) -> None:
        """Store `layout` in its place (instead of `replaced`, the body it continued); past
        `PER_KEY` bodies or `max_bytes` the ones stored longest ago leave."""
        if replaced is not None:
            at = bisect.bisect_left(self.bodies, replaced.body)
            while self.layouts[at] is not replaced:  # bodies kept twice sort together
                at += 1
            self._drop(at)
        while self.layouts and (
            len(self.layouts) >= PER_KEY or self.size + len(layout.body) > max_bytes
        ):
            self._drop(self.stamps.index(min(self.stamps)))
        at = bisect.bisect_left(self.bodies, layout.body)
        self._clock += 1
        self.bodies.insert(at, layout.body)
        self.layouts.insert(at, layout)
        self.stamps.insert(at, self._clock)
        self.size += len(layout.body)

    def _drop(self, at: int) -> None:
        self.size -= len(self.bodies.pop(at))
        del self.layouts[at], self.stamps[at]


def _closest(kept: list[_Layout], body: bytes) -> tuple[_Layout | None, int]:
    """Of `kept`, the body that shares the most whole array elements with `body`, and how
    many."""
    best: _Layout | None = None
    most = -1
    for layout in kept:
        common = _common_prefix(layout.body, body)
        if common < layout.start:
            continue
        reused = bisect.bisect_right(layout.ends, common)
        if reused > most:
            best, most = layout, reused
    return best, max(most, 0)


def _common_prefix(old: bytes, new: bytes) -> int:
    """How many leading bytes `old` and `new` share: a binary search of memcmp calls, each
    comparing only the half not yet known equal."""
    view = memoryview(old)
    low, high = 0, min(len(old), len(new))
    while low < high:
        middle = (low + high + 1) // 2
        if new.startswith(view[low:middle], low):
            low = middle
        else:
            high = middle - 1
    return low


def _resume(
    old: _Layout, reused: int, body: bytes, array: str
) -> tuple[dict[str, Any], _Layout] | None:
    """`body` parsed from after its first `reused` elements (shared with `old`), or None when
    the result is not proven to be `orjson.loads(body)`. When `body` ends as `old` did (the
    fields after the array, an agent's tools and instructions, are the same bytes), those
    fields are taken over too, and only the new elements are parsed."""
    at = old.ends[reused - 1] if reused else old.start
    # A placeholder element leaves the parser where it was after the last element taken over:
    # a `,` or `]` must follow, as in the body itself.
    opening = b'{"' + array.encode() + (b'":[0' if reused else b'":[')
    same_tail = len(body) - len(old.tail) > at and body.endswith(old.tail)
    end = len(body) - len(old.tail) if same_tail else len(body)
    try:
        rest = orjson.loads(opening + body[at:end] + (b"}" if same_tail else b""))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(rest, dict) or not rest.keys().isdisjoint(old.head):
        return None
    added = rest.pop(array, None)
    if not isinstance(added, list) or (reused and (not added or added[0] != 0)):
        return None
    if same_tail:  # the same bytes, the same fields (more, ending alike, fail the check below)
        rest, tail = old.rest, old.tail
    added = added[1:] if reused else added
    try:
        written = [orjson.dumps(item) for item in added]
        if not same_tail:
            tail = _tail(rest)
    except orjson.JSONEncodeError:
        return None
    separator = b"," if reused and written else b""
    # The body from the first new element on is exactly what orjson writes for the new
    # elements and the fields after them (the kept tail is known to be orjson's writing).
    if body[at:end] != separator + b",".join(written) + b"]" + (b"" if same_tail else tail):
        return None
    items = old.items[:reused] + added
    ends = old.ends[:reused]
    offset = at + len(separator)
    for text in written:
        offset += len(text)
        ends.append(offset)
        offset += 1
    payload = {**old.head, array: items, **rest}
    return payload, _Layout(body, old.head, old.start, items, ends, rest, tail)


def _layout(body: bytes, payload: dict[str, Any], array: str) -> _Layout | None:
    """Where `payload`'s array elements end in `body`, when `body` is exactly orjson's writing
    of `payload` (None otherwise: such a body is always parsed whole)."""
    items = payload.get(array)
    if not isinstance(items, list):
        return None
    keys = list(payload)
    split = keys.index(array)
    head = {k: payload[k] for k in keys[:split]}
    rest = {k: payload[k] for k in keys[split + 1 :]}
    try:
        opening = orjson.dumps(head)[:-1] + (b"," if head else b"") + orjson.dumps(array) + b":["
        tail = _tail(rest)
    except orjson.JSONEncodeError:
        return None
    if not body.startswith(opening) or not body.endswith(b"]" + tail):
        return None
    ends: list[int] = []
    offset = len(opening)
    for item in items:
        try:
            text = orjson.dumps(item)
        except orjson.JSONEncodeError:
            return None
        if not body.startswith(text, offset):
            return None
        offset += len(text)
        ends.append(offset)
        if len(ends) < len(items) and body[offset : offset + 1] != b",":
            return None
        offset += 1
    if (offset if items else offset + 1) + len(tail) != len(body):
        return None
    return _Layout(body, head, len(opening), list(items), ends, rest, tail)


def _tail(fields: dict[str, Any]) -> bytes:
    """What follows the array's `]` when `fields` come after it: `,"a":1}` or `}`."""
    return b"," + orjson.dumps(fields)[1:] if fields else b"}"
