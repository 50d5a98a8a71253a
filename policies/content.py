"""Building a message's new content from text, keeping the parts that are not text.

Rule: a step that rewrites a message's text never touches its other fields (role, name,
tool_call_id, tool_calls, the client's extra keys) and never loses a non-text content part
(images, audio, files); a string content stays a string and an array stays an array.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def with_text(data: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The message with its textual content replaced by `text`."""
    new = dict(data)
    content = data.get("content")
    if isinstance(content, list):
        others = [p for p in content if not (isinstance(p, Mapping) and p.get("type") == "text")]
        new["content"] = [{"type": "text", "text": text}, *others]
    else:
        new["content"] = text
    return new


def append_text(data: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The message with `text` added after its content (a new text part for content arrays)."""
    new = dict(data)
    content = data.get("content")
    if isinstance(content, list):
        new["content"] = [*content, {"type": "text", "text": text.lstrip("\n")}]
    elif isinstance(content, str):
        new["content"] = content + text
    else:
        new["content"] = text.lstrip("\n")
    return new
