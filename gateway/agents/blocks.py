"""Anthropic's `compact_20260112` edit, emulated for upstreams that do not know it.

With `context_management.edits: [{"type": "compact_20260112", ...}]` Anthropic summarises a
conversation whose input passes `trigger` (`{"type": "input_tokens", "value": N}`, default
150 000, at least 50 000), puts the summary in a `compaction` block at the start of the answer's
content, and answers from the compacted context. `instructions` replace the default summary
prompt; with `pause_after_compaction` the answer is the block alone (`stop_reason:
"compaction"`). The client sends the block back in its assistant message on later requests, and
the API drops every message block before it.

For a model whose `context_management` is `emulate`, the gateway plays that part:

- **Compacting**: past the trigger, the summary is made by the gateway (a summary made ahead of
  need when one covers the history, else its summariser, with the edit's `instructions` when
  given) and the upstream gets the system prompt, the summary as a pinned user message and the
  open turn (the last user message, with the assistant message whose tool calls it answers)
  verbatim. The answer gets the `compaction` block first: in a stream its
  `content_block_start` / `compaction_delta` / `content_block_stop` come right after
  `message_start`, and the upstream's block indices are shifted by one. The edit is reported in
  `context_management.applied_edits` as the other edits are. A summary that cannot be made
  leaves the request uncompacted (the gateway's own compaction still keeps it in the window).
- **Reading back**: for every model not `native` (whether or not the request carries the
  field), everything before the latest `compaction` block that has a summary becomes that
  summary as user text; a block with no summary (a failed compaction) is a no-op and is
  removed. An upstream that does not know the block type never sees one.

The rule this module keeps: what it forwards holds no `compaction` block, and every `tool_use`
it forwards is followed by its `tool_result` (both sides of a pair are kept or dropped together).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import InvalidRequestError
from ..wire.fields import EXTENSION
from .remote import SUMMARY_INTRO

COMPACT = "compact_20260112"
BLOCK = "compaction"
DEFAULT_TRIGGER = 150_000
MIN_TRIGGER = 50_000
PAUSED = "compaction"  # the stop_reason of an answer that is the compaction block alone


@dataclass(frozen=True, slots=True)
class CompactEdit:
    """A `compact_20260112` edit, with Anthropic's defaults filled in."""

    trigger: int = DEFAULT_TRIGGER
    pause: bool = False
    instructions: str | None = None


def compact_edit(edits: Sequence[Mapping[str, Any]]) -> CompactEdit | None:
    """The request's compaction edit, validated (400 for a malformed one), if it has one."""
    found = [e for e in edits if e.get("type") == COMPACT]
    if not found:
        return None
    edit = found[-1]
    trigger = edit.get("trigger")
    value = DEFAULT_TRIGGER
    if trigger is not None:
        if (
            not isinstance(trigger, dict)
            or trigger.get("type") != "input_tokens"
            or type(trigger.get("value")) is not int
        ):
            raise _invalid("trigger must be {'type': 'input_tokens', 'value': <int>}")
        value = trigger["value"]
        if value < MIN_TRIGGER:
            raise _invalid(f"trigger must be at least {MIN_TRIGGER} input tokens")
    pause = edit.get("pause_after_compaction", False)
    if not isinstance(pause, bool):
        raise _invalid("pause_after_compaction must be a boolean")
    instructions = edit.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _invalid("instructions must be a string")
    return CompactEdit(value, pause, instructions.strip() or None if instructions else None)


def _invalid(message: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"context_management: {COMPACT} {message}.", param="context_management"
    )


# -- the request -------------------------------------------------------------------------------


def has_block(messages: Sequence[Any]) -> bool:
    """Whether any message holds a `compaction` block (cheap: most requests have none)."""
    return any(
        isinstance(m, dict)
        and isinstance(m.get("content"), list)
        and any(_is_block(b) for b in m["content"])
        for m in messages
    )


def read_back(messages: Sequence[Any]) -> list[Any]:
    """`messages` as a non-native upstream gets them: everything before the latest compaction
    block with a summary replaced by that summary as user text, and no compaction block left."""
    latest = None
    for i, message in enumerate(messages):
        for j, block in enumerate(_blocks(message)):
            if _is_block(block) and isinstance(block.get("content"), str):
                latest = (i, j)
    if latest is None:
        return [m for m in (_without_blocks(m) for m in messages) if m is not None]
    i, j = latest
    block = messages[i]["content"][j]
    after = [b for b in messages[i]["content"][j + 1 :] if not _is_block(b)]
    rest = {**messages[i], "content": after} if after else None
    later = [m for m in (_without_blocks(m) for m in messages[i + 1 :]) if m is not None]
    if later and later[0].get("role") == "user":  # results of calls made before the block go
        calls = {b.get("id") for b in _blocks(rest) if b.get("type") == "tool_use"}
        first = _answering(later[0], calls)
        later = [first, *later[1:]] if first is not None else later[1:]
    return _after_summary(block["content"], block.get("cache_control"), rest, later)


def open_turn(messages: Sequence[Any]) -> int | None:
    """Where the open turn starts: the last user message, or the assistant message before it
    whose tool calls it answers. None when there is no user message to answer."""
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        return None
    start = users[-1]
    answers = any(b.get("type") == "tool_result" for b in _blocks(messages[start]))
    if answers and start > 0 and messages[start - 1].get("role") == "assistant":
        start -= 1
    return start


def compacted(messages: Sequence[Any], summary: str, start: int) -> list[Any]:
    """What the upstream gets once the history before `start` (the open turn) is summarised."""
    return _after_summary(summary, None, None, list(messages[start:]))


def _after_summary(
    summary: str, marker: Any, rest: Mapping[str, Any] | None, later: list[Any]
) -> list[Any]:
    """The summary as user text (pinned: the gateway's own compaction keeps it), then the rest
    of the compacting assistant message, then what came after it. Two user messages in a row
    become one (strict upstreams refuse them)."""
    text: dict[str, Any] = {"type": "text", "text": SUMMARY_INTRO + summary}
    if marker is not None:
        text["cache_control"] = marker  # the client's breakpoint stays on what replaced it
    if rest is None and later and later[0].get("role") == "user":
        first = later[0]
        content = first.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        merged = {**first, "content": [text, *(blocks or [])], EXTENSION: {"pin": True}}
        return [merged, *later[1:]]
    head: list[Any] = [{"role": "user", "content": [text], EXTENSION: {"pin": True}}]
    return [*head, *([rest] if rest is not None else []), *later]


def _answering(message: Mapping[str, Any], calls: set[Any]) -> Mapping[str, Any] | None:
    """The user message without tool results for calls other than `calls`; None if empty."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    kept = [
        b
        for b in content
        if not (isinstance(b, dict) and b.get("type") == "tool_result")
        or b.get("tool_use_id") in calls
    ]
    if len(kept) == len(content):
        return message
    return {**message, "content": kept} if kept else None


def _blocks(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _is_block(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == BLOCK


def _without_blocks(message: Any) -> Any:
    """The message without compaction blocks; None when nothing else was in it."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list) or not any(_is_block(b) for b in content):
        return message
    kept = [b for b in content if not _is_block(b)]
    return {**message, "content": kept} if kept else None


# -- the answer --------------------------------------------------------------------------------


def block(summary: str) -> dict[str, Any]:
    return {"type": BLOCK, "content": summary}


def with_block(answer: dict[str, Any], summary: str) -> dict[str, Any]:
    """A non-streamed Messages answer with the compaction block first in its content."""
    content = answer.get("content")
    return {**answer, "content": [block(summary), *(content if isinstance(content, list) else [])]}


def block_events(summary: str, index: int = 0) -> bytes:
    """The compaction block as a stream carries it: start, one delta with the whole summary,
    stop."""
    events = (
        (
            "content_block_start",
            {"index": index, "content_block": {"type": BLOCK, "content": None}},
        ),
        (
            "content_block_delta",
            {"index": index, "delta": {"type": "compaction_delta", "content": summary}},
        ),
        ("content_block_stop", {"index": index}),
    )
    return b"".join(_frame(name, {"type": name, **data}) for name, data in events)


class BlockInStream:
    """Rewrites a Messages stream, event by event, to begin its content with the compaction
    block: inserted after `message_start`, and every upstream block's index one higher."""

    def __init__(self, summary: str) -> None:
        self.summary = summary

    def event(self, event: bytes) -> bytes:
        """One event (without its blank line), rewritten; may become several events."""
        for name in (b"content_block_start", b"content_block_delta", b"content_block_stop"):
            if name in event:
                return self._shifted(event)
        if b"message_start" in event and _data(event, "message_start") is not None:
            return event + b"\n\n" + block_events(self.summary).rstrip(b"\n")
        return event

    def _shifted(self, event: bytes) -> bytes:
        lines = event.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(b"data:"):
                try:
                    data = orjson.loads(line[5:])
                except orjson.JSONDecodeError:
                    return event
                if not isinstance(data, dict) or not isinstance(data.get("index"), int):
                    return event
                lines[i] = b"data: " + orjson.dumps({**data, "index": data["index"] + 1})
                return b"\n".join(lines)
        return event


def paused(model: str, summary: str, report: Mapping[str, Any] | None) -> dict[str, Any]:
    """The answer of `pause_after_compaction`: the compaction block alone. The summary was
    the gateway's own spend, so nothing is billed."""
    answer: dict[str, Any] = {
        "id": "msg_" + uuid.uuid4().hex,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block(summary)],
        "stop_reason": PAUSED,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 0,
        },
    }
    if report is not None:
        answer["context_management"] = report
    return answer


def paused_stream(answer: Mapping[str, Any]) -> bytes:
    """`paused` as the event stream a streamed request gets."""
    start = {**answer, "content": [], "stop_reason": None}
    start.pop("context_management", None)
    delta: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": PAUSED, "stop_sequence": None},
        "usage": answer["usage"],
    }
    if "context_management" in answer:
        delta["context_management"] = answer["context_management"]
    return b"".join(
        [
            _frame("message_start", {"type": "message_start", "message": start}),
            block_events(answer["content"][0]["content"]),
            _frame("message_delta", delta),
            _frame("message_stop", {"type": "message_stop"}),
        ]
    )


def _frame(name: str, data: Mapping[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _data(event: bytes, kind: str) -> dict[str, Any] | None:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                data = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return None
            return data if isinstance(data, dict) and data.get("type") == kind else None
    return None
