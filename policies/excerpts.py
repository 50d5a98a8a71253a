"""Excerpts: a large text keeps its head (and its tail where useful); the rest goes behind a ref.

Rule: an excerpt of a text is the text's own first lines, a note, and (unless the text is code)
its own last lines; the lines in between are handed back, exactly, as a `StoredOutput` under a
ref that the gateway stores and the model can read with the expansion tool (design D13.4), the
same tool that reads masked tool outputs. So `head + rest + tail == text`, byte for byte, and the
note names the ref and which lines it holds.

A text holding fenced blocks (the files Aider adds to the chat, a log pasted between two
sentences) is excerpted block by block: the prose around the blocks stays whole, and every block
keeps at least `floor` tokens of its own head, so no file or pasted output disappears whole;
larger blocks give up more (the kept sizes are levelled: a common cap, smaller blocks whole).

What an excerpt looks like is a function of the text and the tokens it may keep: the same
message cut to the same size renders the same bytes on every request and every replica.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .chunking import detect
from .step import StoredOutput

NOTE = (
    "[compactgate: lines {first}-{last} of {total} are not shown (ref={ref}); read them with the "
    'tool tool_output_cache {{"ref_id": "{ref}", "offset": 1, "limit": {count}}}, whose line 1 '
    "is line {first} here]"
)
NOTE_RE = re.compile(r"\[compactgate: lines \d+-\d+ of \d+ are not shown \(ref=([^)\s]+)\)")
NOTE_START = "[compactgate: lines "
NOTE_SAMPLE = NOTE.format(first=1001, last=1999, total=1999, ref="x" * 24, count=999)
_FENCE = re.compile(r"^([ \t]*)(```|~~~)[^\n]*\n(.*?)^\1\2[ \t]*$", re.M | re.S)
TAIL_SHARE = 1 / 3  # of what a block keeps, for text that is not code (a log's verdict is last)


@dataclass(frozen=True, slots=True)
class Block:
    """A part of a text that may be excerpted: characters [start, end), and whether it is code."""

    start: int
    end: int
    code: bool


@dataclass(frozen=True, slots=True)
class Excerpt:
    text: str
    stored: tuple[StoredOutput, ...]


def is_excerpt(text: str) -> bool:
    """Whether `text` already holds an excerpt's note (it is never excerpted again)."""
    return NOTE_START in text and NOTE_RE.search(text) is not None


def blocks(text: str) -> list[Block]:
    """The fenced blocks' bodies when the text has any, else the whole text as one block."""
    found = [
        Block(m.start(3), m.end(3), detect(m.group(3)) == "code")
        for m in _FENCE.finditer(text)
        if m.end(3) > m.start(3)
    ]
    return found or [Block(0, len(text), detect(text) == "code")]


def levelled(sizes: Sequence[int], room: int, floor: int) -> list[int]:
    """What each block keeps: a common cap so that the kept sizes add up to `room` (blocks under
    the cap whole), never under `floor` (or the block's size, when smaller)."""
    low = [min(size, floor) for size in sizes]
    if sum(sizes) <= room:
        return list(sizes)
    if sum(low) >= room:
        return low
    cap_low, cap_high = floor, max(sizes)
    while cap_low < cap_high:  # the largest cap whose total fits
        cap = (cap_low + cap_high + 1) // 2
        if sum(min(size, max(cap, floor)) for size in sizes) <= room:
            cap_low = cap
        else:
            cap_high = cap - 1
    return [min(size, max(cap_low, floor)) for size in sizes]


def excerpt(
    text: str,
    keep: int,
    count: Callable[[str], int],
    ref_for: Callable[[str], str],
    floor: int,
) -> Excerpt | None:
    """`text` cut to about `keep` tokens; None when it already fits or nothing can be cut."""
    found = blocks(text)
    sizes = [count(text[b.start : b.end]) for b in found]
    outside = max(0, count(text) - sum(sizes))
    note = count(NOTE_SAMPLE)  # every cut block carries a note; its floor is over and above it
    caps = levelled(sizes, max(0, keep - outside), floor + note)
    parts: list[str] = []
    stored: list[StoredOutput] = []
    at = 0
    for block, size, cap in zip(found, sizes, caps, strict=True):
        parts.append(text[at : block.start])
        body = text[block.start : block.end]
        at = block.end
        cut = _cut(body, cap - note, block.code, count, ref_for) if cap < size else None
        if cut is None:
            parts.append(body)
            continue
        parts.append(cut[0])
        stored.append(cut[1])
    if not stored:
        return None
    parts.append(text[at:])
    return Excerpt("".join(parts), tuple(stored))


def _cut(
    body: str, cap: int, code: bool, count: Callable[[str], int], ref_for: Callable[[str], str]
) -> tuple[str, StoredOutput] | None:
    """`body` as head (+ tail) in about `cap` tokens, a note between, and its hidden middle."""
    lines = body.split("\n")
    costs = [count(line) + 1 for line in lines]
    tail_room = 0 if code else int(cap * TAIL_SHARE)
    head_room = cap - tail_room
    head = 0
    used = 0
    while head < len(lines) and used + costs[head] <= head_room:
        used += costs[head]
        head += 1
    tail = 0
    used = 0
    while tail < len(lines) - head - 1 and used + costs[-1 - tail] <= tail_room:
        used += costs[-1 - tail]
        tail += 1
    start = sum(len(line) + 1 for line in lines[:head])  # after the head's last newline
    if head == 0:  # not even the first line fits: keep its first characters
        start = min(len(lines[0]), max(1, head_room * 3))
    # the tail is its lines and the newlines between them; the rest ends with the one before
    end = len(body) - (
        sum(len(line) for line in lines[len(lines) - tail :]) + tail - 1 if tail else 0
    )
    if end <= start:
        return None
    rest = body[start:end]
    try:
        ref = ref_for(rest)
    except LookupError:
        return None
    first = body.count("\n", 0, start) + 1
    hidden = rest.count("\n") + (0 if rest.endswith("\n") else 1)
    total = body.count("\n") + (0 if body.endswith("\n") else 1)
    note = NOTE.format(first=first, last=first + hidden - 1, total=total, ref=ref, count=hidden)
    joined = body[:start] + note  # the head, up to where the rest starts (a line's end, mostly)
    if tail:
        joined += "\n" + body[end:]
    elif body.endswith("\n"):
        joined += "\n"
    return joined, StoredOutput(ref=ref, text=rest)
