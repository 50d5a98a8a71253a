"""What a ledger entry is: one line of the user's words, how the block is read back, how
passages become lines, and which entries another one holds.

Rule: an entry is a passage the user wrote, word for word, on one line (its line breaks become
spaces); a passage longer than the limit is kept sentence by sentence, and only a single
sentence longer than that is cut (its start kept, an ellipsis marking the cut). An entry that
another entry holds whole is merged into the longer one. The block is the header and one
bulleted line per entry, so it reads back into the same entries.
"""

from __future__ import annotations

from typing import NamedTuple

from ..conversation import Message
from ..salience import Statement, normalised, statements

BULLET = "- "


class Entry(NamedTuple):
    text: str
    # None for an entry read back from the block: scored from its text only when the block
    # must shrink (most passes it fits, and a new request's memo has not seen it yet)
    score: float | None
    order: int  # position in the conversation (earlier entries first)


def parse(text: str, header: str) -> list[Entry]:
    """The entries of a ledger block, as `_message` wrote them, not yet scored."""
    lines = text.split("\n")
    if lines and lines[0] == header:
        lines = lines[1:]
    entries = [line[len(BULLET) :] for line in lines if line.startswith(BULLET)]
    return [Entry(entry, None, k) for k, entry in enumerate(entries)]


def lines_of(statement: Statement, threshold: float, limit: int) -> list[str]:
    """A passage as ledger lines: one line (its line breaks become spaces), or, when longer
    than `limit`, its salient sentences one by one; a single sentence longer than that is cut
    (its start kept, an ellipsis marking the cut)."""
    line = " ".join(statement.text.split())
    if len(line) <= limit:
        return [line]
    out = []
    for sentence in statements(statement.text):
        if sentence.score >= threshold:
            text = " ".join(sentence.text.split())
            out.append(text if len(text) <= limit else text[: limit - 1].rstrip() + "…")
    return out


def texts_of(message: Message) -> tuple[str, ...]:
    """A message's texts: its content, or each text part of a content array."""
    content = message.data.get("content")
    if type(content) is str:  # most messages (`Message.text` is then the content itself)
        return (content,)
    if isinstance(content, list):
        return tuple(
            [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        )
    return (message.text,)


def merged(entries: list[Entry], keys: list[str] | None = None) -> list[Entry]:
    """`entries` without those another entry holds whole (the longer one stays, where it was
    said first); `keys`: their normalised texts, when worked out already."""
    if keys is None:
        keys = [normalised(e.text) for e in entries]
    # All keys on one line each (a key has no line break: `normalised` collapses whitespace),
    # so that a key found only once among them, which is most, is held by no other one.
    joined = "\n".join(keys)
    out = []
    for k, entry in enumerate(entries):
        key = keys[k]
        if joined.count(key) > 1 and any(
            key in other and (len(other) > len(key) or j < k)
            for j, other in enumerate(keys)
            if j != k
        ):
            continue
        out.append(entry)
    return out
