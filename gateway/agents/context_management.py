"""Anthropic's `context_management` field on any upstream: forwarded, emulated or removed.

Claude Code and the anthropic SDK may send `context_management.edits` (with the
`context-management-2025-06-27` beta). Anthropic applies them itself; an upstream that does not
know the field answers "context_management: Extra inputs are not permitted". Per model
(`models[].context_management`):

* `native` (default): forwarded unchanged, for an upstream that applies the edits.
* `strip`: removed before forwarding; the gateway's own policies still keep the request inside
  the window.
* `emulate`: removed, and its edits applied here, before the policies run, with their
  documented parameters and defaults:
  - `clear_thinking_20251015`: thinking blocks of all but the last `keep` thinking turns
    (default 1) are dropped (`keep: "all"` keeps every one);
  - `clear_tool_uses_20250919`: once the input passes `trigger` (default 100 000 input tokens),
    the results of the oldest tool uses are replaced by a short placeholder, keeping the last
    `keep` (default 3) tool uses and the tools named in `exclude_tools`, clearing at least
    `clear_at_least` input tokens when set (else as many as the trigger asks); with
    `clear_tool_inputs` their inputs are emptied too;
  - `compact_20260112`: past its trigger the history is summarised and the answer begins with
    a `compaction` block (`compaction_blocks`, which also reads such blocks back for every
    model that is not `native`).
  The edits applied are reported as Anthropic reports them: in a non-streamed answer's
  `context_management.applied_edits`, and in a stream's `message_delta` event.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from ..counting.prefix import Counted
from ..errors import GatewayError, InvalidRequestError
from ..path.sse import EventSplitter
from ..routing import Route
from ..wire import WireRequest
from ..wire.fields import serialise
from .blocks import (
    COMPACT,
    BlockInStream,
    CompactEdit,
    compact_edit,
    compacted,
    has_block,
    open_turn,
    read_back,
    with_block,
)

log = logging.getLogger("compactgate.compaction_blocks")

FIELD = "context_management"
CLEARED = "[tool result cleared to save context]"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"


@dataclass(slots=True)
class Applied:
    """What an emulation did, in Anthropic's `applied_edits` shape."""

    edits: list[dict[str, Any]] = field(default_factory=list)
    compact: CompactEdit | None = None  # the request's compaction edit, made asynchronously
    compaction: str | None = None  # the summary, when compacted: the answer's first block

    @property
    def paused(self) -> bool:
        """Compacted with `pause_after_compaction`: the answer is the compaction block alone."""
        return self.compaction is not None and self.compact is not None and self.compact.pause

    def report(self) -> dict[str, Any] | None:
        return {"applied_edits": self.edits} if self.edits else None

    # -- as the answer's decoration (path.outcome.Decoration) ------------------------------

    @property
    def active(self) -> bool:
        return bool(self.edits)

    def whole(self, body: bytes) -> bytes:
        return with_report(body, self)

    def stream(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return reported_in_stream(chunks, self) if self.edits else chunks


def adapt(
    payload: Mapping[str, Any], mode: str, count: Callable[[Any], int]
) -> tuple[dict[str, Any] | None, Applied]:
    """The payload to forward under `mode` (None: unchanged), and what was emulated.

    `count` sizes a content value in tokens (the route's counter)."""
    if mode == "native":
        return None, Applied()
    messages = payload.get("messages")
    blocks = isinstance(messages, list) and has_block(messages)
    if FIELD not in payload and not blocks:
        return None, Applied()
    forwarded = {k: v for k, v in payload.items() if k != FIELD}
    if blocks and isinstance(messages, list):  # a non-native upstream must not see them
        forwarded["messages"] = messages = read_back(messages)
    applied = Applied()
    if mode == "emulate" and FIELD in payload:
        edits = _edits(payload[FIELD])
        applied.compact = compact_edit(edits)
        if isinstance(messages, list):
            messages = [dict(m) if isinstance(m, dict) else m for m in messages]
            for edit in edits:
                kind = edit.get("type")
                if kind == CLEAR_THINKING:
                    _clear_thinking(messages, edit, applied)
                elif kind == CLEAR_TOOL_USES:
                    _clear_tool_uses(messages, edit, applied, count)
            forwarded["messages"] = messages
    return forwarded, applied


def with_report(body: bytes, applied: Applied) -> bytes:
    """A non-streamed Messages answer with `context_management.applied_edits` added."""
    report = applied.report()
    if report is None and applied.compaction is None:
        return body
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(answer, dict) or answer.get("type") != "message":
        return body
    if applied.compaction is not None:
        answer = with_block(answer, applied.compaction)
    if report is not None:
        answer[FIELD] = report
    return orjson.dumps(answer)


async def reported_in_stream(
    chunks: AsyncIterator[bytes], applied: Applied
) -> AsyncIterator[bytes]:
    """A streamed Messages answer with `context_management.applied_edits` in its
    `message_delta` event, where a stream from Anthropic carries it. Events pass as they come;
    only a partial event waits for its end, and only until that event has gone by."""
    report = applied.report()
    block = BlockInStream(applied.compaction) if applied.compaction is not None else None
    events = EventSplitter()
    async for chunk in chunks:
        if report is None and block is None:
            yield chunk
            continue
        out = []
        for event in events.feed(chunk):
            if block is not None:  # every block event's index moves: each is read
                event = block.event(event)
            if report is not None and b"message_delta" in event:
                rewritten = _with_edits(event, report)
                if rewritten is not None:
                    event, report = rewritten, None
            out.append(event + b"\n\n")
        if report is None and block is None:  # what was held back goes now, the rest as it comes
            out.append(events.flush())
        if out:
            yield b"".join(out)
    if rest := events.flush():
        yield rest


def _with_edits(event: bytes, report: dict[str, Any]) -> bytes | None:
    """The `message_delta` event with the report added, or None if `event` is not one."""
    lines = event.split(b"\n")
    for i, line in enumerate(lines):
        if not line.startswith(b"data:"):
            continue
        try:
            data = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return None
        if not isinstance(data, dict) or data.get("type") != "message_delta":
            return None
        lines[i] = b"data: " + orjson.dumps({**data, FIELD: report})
        return b"\n".join(lines)
    return None


def _edits(value: Any) -> list[dict[str, Any]]:
    edits = value.get("edits") if isinstance(value, dict) else None
    if not isinstance(edits, list) or not all(isinstance(e, dict) for e in edits):
        raise InvalidRequestError(
            "context_management.edits must be a list of objects.", param="context_management"
        )
    return edits


def _amount(value: Any, default: int, unit: str, where: str) -> int:
    if value is None:
        return default
    if (
        not isinstance(value, dict)
        or value.get("type") != unit
        or not isinstance(value.get("value"), int)
    ):
        raise InvalidRequestError(
            f"context_management: {where} must be {{'type': '{unit}', 'value': <int>}}.",
            param="context_management",
        )
    return int(value["value"])


def _clear_thinking(messages: list[Any], edit: Mapping[str, Any], applied: Applied) -> None:
    keep_value = edit.get("keep")
    if keep_value == "all":
        return
    keep = _amount(keep_value, 1, "thinking_turns", "keep")
    thinking_turns = [
        i
        for i, m in enumerate(messages)
        if isinstance(m, dict)
        and m.get("role") == "assistant"
        and isinstance(m.get("content"), list)
        and any(_is_thinking(b) for b in m["content"])
    ]
    cleared_turns = cleared_blocks = 0
    for index in thinking_turns[: max(0, len(thinking_turns) - keep)]:
        content = messages[index]["content"]
        kept = [b for b in content if not _is_thinking(b)]
        cleared_blocks += len(content) - len(kept)
        cleared_turns += 1
        messages[index] = {**messages[index], "content": kept or [{"type": "text", "text": ""}]}
    if cleared_turns:
        applied.edits.append(
            {
                "type": CLEAR_THINKING,
                "cleared_thinking_turns": cleared_turns,
                "cleared_input_tokens": 0,
            }
        )


def _clear_tool_uses(
    messages: list[Any], edit: Mapping[str, Any], applied: Applied, count: Callable[[Any], int]
) -> None:
    trigger = _amount(edit.get("trigger"), 100_000, "input_tokens", "trigger")
    keep = _amount(edit.get("keep"), 3, "tool_uses", "keep")
    at_least = _amount(edit.get("clear_at_least"), 0, "input_tokens", "clear_at_least")
    names = edit.get("exclude_tools") or []
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise InvalidRequestError(
            "context_management: exclude_tools must be a list of tool names.",
            param="context_management",
        )
    excluded = set(names)
    clear_inputs = edit.get("clear_tool_inputs") is True
    total = sum(count(m.get("content")) for m in messages if isinstance(m, dict))
    if total <= trigger:
        return
    uses: list[tuple[int, int, str, str]] = []  # (message, block, id, name)
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if message.get("role") == "assistant" and isinstance(content, list):
            for j, block in enumerate(content):
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    uses.append((i, j, str(block.get("id")), str(block.get("name"))))
    candidates = [u for u in uses[: max(0, len(uses) - keep)] if u[3] not in excluded]
    ids = {u[2] for u in candidates}
    cleared = saved = 0
    goal = max(at_least, total - trigger)
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or (saved >= goal and at_least):
            continue
        changed = False
        blocks = []
        for block in content:
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_result"
                and block.get("tool_use_id") in ids
            ):
                before = count(block.get("content"))
                block = {**block, "content": CLEARED}
                saved += max(0, before - count(CLEARED))
                cleared += 1
                changed = True
            elif clear_inputs and isinstance(block, dict) and block.get("id") in ids:
                block = {**block, "input": {}}
                changed = True
            blocks.append(block)
        if changed:
            messages[i] = {**message, "content": blocks}
    if cleared:
        applied.edits.append(
            {"type": CLEAR_TOOL_USES, "cleared_tool_uses": cleared, "cleared_input_tokens": saved}
        )


def _is_thinking(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking")


class ContextManagement:
    """Anthropic's `context_management` on a Messages request, as the model's mode wants it
    (module docstring): `apply` returns the request to go on with and what was emulated.
    `compact_20260112` past its trigger summarises the history first (with the gateway's
    Responses compaction summariser: `summarise`)."""

    def __init__(
        self,
        summarise: Summarise,
        counts: Callable[[WireRequest, Route, str], Counted],
        tools_tokens: Callable[[WireRequest, Route], int],
        max_messages: int,
    ) -> None:
        self._summarise = summarise
        self._counts = counts
        self._tools_tokens = tools_tokens
        self._max_messages = max_messages

    async def apply(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> tuple[WireRequest, Applied]:
        request, applied = apply_to(request, route, self._max_messages)
        if applied.compact is not None:
            request = await self.compact(request, route, tenant, headers, applied)
        return request, applied

    async def compact(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        headers: Sequence[tuple[bytes, bytes]],
        applied: Applied,
    ) -> WireRequest:
        """`request` compacted as its `compact_20260112` edit asks, when its input passes the
        trigger; what was done is noted in `applied` (the summary, for the answer's block)."""
        edit = applied.compact
        messages = request.payload.get("messages")
        if edit is None or not isinstance(messages, list):
            return request
        counted = self._counts(request, route, tenant)
        tokens = sum(counted.counts) + self._tools_tokens(request, route)
        start = open_turn(messages)
        if tokens <= edit.trigger or not start:
            return request  # under the trigger, or nothing before the open turn to summarise
        try:
            summary, _, _ = await self._summarise(
                request, route, tenant, headers, edit.instructions
            )
        except GatewayError as error:
            log.warning(
                "compaction for %s not made, forwarded as it is: %s", COMPACT, error.message
            )
            return request
        payload = {**request.payload, "messages": compacted(messages, summary, start)}
        forwarded = request.wire.parse(serialise(payload), self._max_messages)
        after = sum(route.counter.message(m) for m in forwarded.messages)
        after += self._tools_tokens(forwarded, route)
        applied.edits.append({"type": COMPACT, "cleared_input_tokens": max(0, tokens - after)})
        applied.compaction = summary
        return forwarded


class Summarise(Protocol):
    """`agents.remote.RemoteCompaction.summarise`: the summary's text, where it came from, and
    the history's size in tokens."""

    def __call__(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        headers: Sequence[tuple[bytes, bytes]],
        instructions: str | None = None,
    ) -> Awaitable[tuple[str, str, int]]: ...


def apply_to(request: Any, route: Any, max_messages: int) -> tuple[Any, Applied]:
    """`request` (a WireRequest) as the model's mode forwards it, parsed again when changed."""
    if request.api != "messages":
        return request, Applied()
    if FIELD not in request.payload and route.context_management == "native":
        return request, Applied()

    def count(value: Any) -> int:
        text = value if isinstance(value, str) else serialise(value).decode()
        return route.counter.text(text)

    forwarded, applied = adapt(request.payload, route.context_management, count)
    if forwarded is None:
        return request, applied
    return request.wire.parse(serialise(forwarded), max_messages), applied
