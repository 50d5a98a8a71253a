"""Anthropic Messages (`POST /v1/messages`): messages and content blocks to the canonical
conversation and back.

How blocks map (the policies then keep every pair whole, as on chat):

- The top-level `system` (a string or text blocks) is the head, never trimmed; a `role: "system"`
  entry inside `messages` is a protected system message where it stands.
- A user message's `tool_result` blocks each become a tool message answering its `tool_use_id`;
  its other blocks (text, images, documents, unknown ones) one user message after them, which
  is where a Turn starts. A user message of tool results only starts no Turn.
- An assistant message is one assistant message: `tool_use` blocks are its tool calls (so each
  stays with its result in the next user message), `thinking` text is counted, and
  `redacted_thinking`, server-tool and unknown blocks ride along unchanged.
- The latest assistant message is pinned: its thinking blocks and signatures must go back
  exactly as they came whenever tools are in use.
- A message holding a `compaction` block stands for the history before it: pinned.

Rendering groups canonical messages back into the message they came from. A message whose
canonical parts all survived unchanged is forwarded exactly as it was sent; otherwise it is
rebuilt from its kept blocks (changed ones rewritten: a masked result's `content`, new text in
place of the old text blocks; `thinking` blocks and their `signature` are never rewritten).
A message a step made is a new user or assistant message, or, for the system role, a text
block appended to `system`. Prompt-cache breakpoints: when a block that carried `cache_control`
is removed, its marker moves to the nearest kept block before it, never past a longer-lived
marker, and there are never more than four.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from policies.conversation import content_text

from ..errors import GatewayError, InvalidRequestError
from .base import Usage, Wire, json_or_none, number, sse_events
from .request import (
    EXTENSION,
    NO_MARKS,
    Marks,
    WireRequest,
    check_count,
    check_tools,
    load_object,
    read_marks,
    read_model,
    read_positive,
    read_stream,
)

if TYPE_CHECKING:
    from policies import Message

    from ..context_errors import ContextError
    from ..tokens import MessageCounter

ROLES = frozenset({"user", "assistant", "system"})
SYSTEM = -1  # layout entry of the canonical message made from the top-level `system`
MAX_BREAKPOINTS = 4
DEFAULT_MAX_TOKENS = 4096  # the gateway's own calls, when no limit is configured
# Anthropic's error `type` for each status the gateway itself answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each canonical message came from, and how many came from each wire message."""

    messages: list[Any]  # the messages as forwarded (our extension stripped)
    spans: list[tuple[int, tuple[int, ...] | None]]  # (message index, block indices | None)
    parts: list[int]  # canonical messages made from each wire message


class MessagesWire(Wire):
    name = "messages"
    upstream_path = "/messages"

    def __init__(self, *, count_only: bool = False) -> None:
        self.count_only = count_only  # /v1/messages/count_tokens: no max_tokens, no stream

    def parse(self, body: bytes, max_messages: int) -> WireRequest:
        payload = load_object(body)
        model = read_model(payload)
        stream = False if self.count_only else read_stream(payload)
        max_output = read_positive(payload, "max_tokens")
        if max_output is None and not self.count_only:
            raise InvalidRequestError("max_tokens: Field required", param="max_tokens")
        raw = payload.get("messages")
        if not isinstance(raw, list):
            raise InvalidRequestError("messages: Field required", param="messages")
        check_count(len(raw), max_messages, "messages")
        builder = _Builder()
        builder.system(payload.get("system"))
        last_assistant = max(
            (i for i, m in enumerate(raw) if isinstance(m, dict) and m.get("role") == "assistant"),
            default=-1,
        )
        for index, message in enumerate(raw):
            builder.message(message, index, pinned=index == last_assistant)
        check_tools(payload, "tools")
        return WireRequest(
            wire=self,
            body=body,
            payload=payload,
            model=model,
            stream=stream,
            messages=builder.messages,
            marks=builder.marks,
            has_extension=builder.has_extension,
            max_output=max_output,
            layout=Layout(builder.wire_messages, builder.spans, builder.parts),
        )

    def render(
        self,
        request: WireRequest,
        messages: Sequence[Message] | None,
        model: str | None,
        inject_usage: bool,
    ) -> dict[str, Any]:
        payload = dict(request.payload)
        layout: Layout = request.layout
        if messages is not None:
            _Renderer(request, layout, payload).render(messages)
        elif request.has_extension:
            payload["messages"] = layout.messages
        if model is not None:
            payload["model"] = model
        return payload

    def max_output_field(self, payload: Mapping[str, Any]) -> str:
        return "max_tokens"

    def tools_tokens(self, request: WireRequest, counter: MessageCounter) -> int:
        tools = request.payload.get("tools")
        if not tools:
            return 0
        return counter.tools(
            [_chat_tool(t) for t in tools],
            system_text=_system_text(request.payload.get("system")),
        )

    # -- errors ------------------------------------------------------------------------------

    def error_body(self, error: GatewayError) -> bytes:
        return orjson.dumps(_error(error))

    def stream_error_event(self, error: GatewayError) -> bytes:
        return b"event: error\ndata: " + orjson.dumps(_error(error)) + b"\n\n"

    def stream_context_error(self, first: bytes) -> ContextError | None:
        if not first:
            return None  # Anthropic-shaped servers do not answer an overflow with an empty 200
        return super().stream_context_error(first)

    def head_decided(self, head: bytes) -> bool:
        """Read past `message_start` and `ping`: an error event may follow them."""
        for name, _ in sse_events(head):
            if name not in (b"message_start", b"ping"):
                return True
        return False

    # -- usage -------------------------------------------------------------------------------

    def usage_of(self, document: Mapping[str, Any]) -> Usage | None:
        message = document.get("message")
        if isinstance(message, dict):  # message_start carries the message object
            document = message
        usage = document.get("usage")
        if not isinstance(usage, dict):
            return None
        return _usage(usage, None)

    def stream_usage(self, name: bytes, data: bytes, known: Usage | None) -> Usage | None:
        if name not in (b"message_start", b"message_delta"):
            return None
        document = json_or_none(data)
        if not isinstance(document, dict):
            return None
        if name == b"message_start":
            return self.usage_of(document)
        usage = document.get("usage")  # cumulative: output so far, input fields when restated
        return _usage(usage, known) if isinstance(usage, dict) else None

    def credential_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key}

    def plain_request(
        self, model: str, system: str, prompt: str, limit: int | None, limit_field: str
    ) -> dict[str, Any]:
        return {
            "model": model,
            "system": system,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": limit or DEFAULT_MAX_TOKENS,  # required by the API
            "stream": False,
        }

    def answer_text(self, document: Mapping[str, Any]) -> str | None:
        content = document.get("content")
        if not isinstance(content, list):
            return None
        return "".join(
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )


def _error(error: GatewayError) -> dict[str, Any]:
    fallback = "api_error" if error.status >= 500 else "invalid_request_error"
    kind = ERROR_TYPES.get(error.status, fallback)
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _usage(usage: Mapping[str, Any], known: Usage | None) -> Usage:
    """Anthropic usage in our convention: `input_tokens` is only the uncached remainder."""
    if known is not None and "input_tokens" not in usage:
        return Usage(
            input=known.input,
            output=number(usage.get("output_tokens")) or known.output,
            cache_read=known.cache_read,
            cache_write_5m=known.cache_write_5m,
            cache_write_1h=known.cache_write_1h,
        )
    read = number(usage.get("cache_read_input_tokens"))
    written = number(usage.get("cache_creation_input_tokens"))
    split = usage.get("cache_creation")
    if isinstance(split, dict):
        hour = number(split.get("ephemeral_1h_input_tokens"))
        five = number(split.get("ephemeral_5m_input_tokens"))
        if hour + five != written:  # trust the total; the remainder is the default 5 minutes
            five = max(0, written - hour)
    else:
        hour, five = 0, written
    return Usage(
        input=number(usage.get("input_tokens")) + read + written,
        output=number(usage.get("output_tokens")),
        cache_read=read,
        cache_write_5m=five,
        cache_write_1h=hour,
    )


class _Builder:
    """Splits messages into canonical messages, remembering which blocks made each one."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.marks: list[Marks] = []
        self.spans: list[tuple[int, tuple[int, ...] | None]] = []
        self.wire_messages: list[Any] = []
        self.parts: list[int] = []
        self.has_extension = False
        self._calls: set[str] = set()
        self._previous_calls: set[str] = set()

    def system(self, system: Any) -> None:
        if system is None:
            return
        if isinstance(system, str):
            content: Any = system
        elif isinstance(system, list):
            content = [_block(b, f"system[{i}]") for i, b in enumerate(system)]
        else:
            raise InvalidRequestError(
                "system: must be a string or an array of text blocks.", param="system"
            )
        self._add({"role": "system", "content": content}, NO_MARKS, (SYSTEM, None))

    def message(self, message: Any, index: int, *, pinned: bool) -> None:
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise InvalidRequestError(f"{where}: must be an object.", param=where)
        marks = NO_MARKS
        if EXTENSION in message:
            self.has_extension = True
            marks = read_marks(message[EXTENSION], f"messages[{index}]")
            message = {k: v for k, v in message.items() if k != EXTENSION}
        self.wire_messages.append(message)
        self.parts.append(0)
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequestError(
                f"{where}.role: Input should be 'user' or 'assistant'", param=f"{where}.role"
            )
        content = message.get("content")
        if pinned:
            marks = Marks(pin=True, priority=marks.priority, kind=marks.kind)
        if isinstance(content, str):
            self._add({"role": role, "content": content}, marks, (index, None))
        elif isinstance(content, list):
            blocks = [_checked(b, f"{where}.content.{i}") for i, b in enumerate(content)]
            if role == "assistant":
                self._assistant(blocks, index, marks)
            elif role == "user":
                self._user(blocks, index, marks, where)
            else:
                data = {"role": role, "content": [_block(b, where) for b in blocks]}
                self._add(data, marks, (index, tuple(range(len(blocks)))))
        else:
            raise InvalidRequestError(
                f"{where}.content: must be a string or an array of content blocks.",
                param=f"{where}.content",
            )
        if role == "assistant":
            self._previous_calls = self._calls
            self._calls = set()

    def _assistant(self, blocks: list[dict[str, Any]], index: int, marks: Marks) -> None:
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[dict[str, Any]] = []
        opaque: list[Any] = []
        for block in blocks:
            kind = block["type"]
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "thinking":
                thinking.append(str(block.get("thinking", "")))
            elif kind == "tool_use":
                call_id = block.get("id")
                if not isinstance(call_id, str):
                    raise InvalidRequestError("tool_use.id: Field required", param="messages")
                self._calls.add(call_id)
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": str(block.get("name", "")),
                            "arguments": orjson.dumps(block.get("input", {})).decode(),
                        },
                    }
                )
            else:
                opaque.append(block)
            if kind == "compaction":
                marks = Marks(pin=True, priority=marks.priority, kind=marks.kind)
        data: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
        if calls:
            data["tool_calls"] = calls
        if thinking:
            data["reasoning_content"] = "\n".join(thinking)
        if opaque:
            data["opaque"] = opaque
        self._add(data, marks, (index, tuple(range(len(blocks)))))

    def _user(self, blocks: list[dict[str, Any]], index: int, marks: Marks, where: str) -> None:
        rest: list[int] = []
        for position, block in enumerate(blocks):
            if block["type"] != "tool_result":
                rest.append(position)
                continue
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise InvalidRequestError(
                    f"{where}.content.{position}.tool_use_id: Field required",
                    param=f"{where}.content.{position}.tool_use_id",
                )
            if call_id not in self._previous_calls:
                raise InvalidRequestError(
                    f"{where}.content.{position}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {call_id}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message.",
                    param=f"{where}.content.{position}",
                )
            content = block.get("content")
            if isinstance(content, list):
                content = [_block(b, where) for b in content if isinstance(b, dict)]
            data = {"role": "tool", "tool_call_id": call_id, "content": content or ""}
            self._add(data, marks, (index, (position,)))
        if rest or not blocks:
            content = [_block(blocks[p], where) for p in rest]
            self._add({"role": "user", "content": content}, marks, (index, tuple(rest)))

    def _add(
        self, data: dict[str, Any], marks: Marks, span: tuple[int, tuple[int, ...] | None]
    ) -> None:
        self.messages.append(data)
        self.marks.append(marks)
        self.spans.append(span)
        if span[0] >= 0:
            self.parts[span[0]] += 1


def _checked(block: Any, where: str) -> dict[str, Any]:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidRequestError(f"{where}.type: Field required", param=where)
    return block


def _block(block: Any, where: str) -> dict[str, Any]:
    """A content block as a canonical part the counter and the policies understand."""
    block = _checked(block, where)
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", "")), "source": block}
    if kind == "image":
        source = block.get("source")
        url = ""
        if isinstance(source, dict):
            if source.get("type") == "base64":
                url = f"data:{source.get('media_type', '')};base64,{source.get('data', '')}"
            else:
                url = str(source.get("url", ""))
        return {"type": "image_url", "image_url": {"url": url}, "source": block}
    if kind == "document":
        return {"type": "file", "source": block}
    return {"type": kind, "source": block}


def _wire_block(part: Any) -> dict[str, Any]:
    """A canonical part back as a content block: its original when it has one."""
    if not isinstance(part, dict):
        return {"type": "text", "text": str(part)}
    source = part.get("source")
    if part.get("type") == "text":
        if isinstance(source, dict):
            if source.get("text") == part.get("text"):
                return source
            return {**source, "text": part.get("text", "")}
        return {"type": "text", "text": str(part.get("text", ""))}
    return source if isinstance(source, dict) else {"type": "text", "text": content_text([part])}


def _wire_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return [_wire_block(p) for p in content]
    text = content_text(content)
    return [{"type": "text", "text": text}] if text else []


class _Renderer:
    """Puts a compacted canonical conversation back into messages and blocks."""

    def __init__(self, request: WireRequest, layout: Layout, payload: dict[str, Any]) -> None:
        self.request = request
        self.layout = layout
        self.payload = payload

    def render(self, messages: Sequence[Message]) -> None:
        layout, originals = self.layout, self.request.messages
        groups: list[list[Any]] = []  # [wire index | None, role, blocks, unchanged parts]
        appended_system: list[dict[str, Any]] = []
        kept: dict[tuple[int, int], dict[str, Any]] = {}  # (message, block) -> block sent
        for message in messages:
            origin = message.origin
            if origin < 0:
                if message.role == "system":
                    appended_system.extend(_wire_blocks(message.data.get("content")))
                else:
                    role = "assistant" if message.role == "assistant" else "user"
                    groups.append([None, role, _wire_blocks(message.data.get("content")), 0])
                continue
            index, positions = layout.spans[origin]
            original = originals[origin]
            same = message.data is original or message.data == original
            if index == SYSTEM:
                if not same:
                    self.payload["system"] = _system_of(message.data.get("content"))
                continue
            wire = layout.messages[index]
            if positions is None:  # string content
                content = wire["content"] if same else content_text(message.data.get("content"))
                blocks: list[Any] = [content]
            else:
                source = wire["content"]
                pairs = (
                    [(p, source[p]) for p in positions]
                    if same
                    else _changed(message.data, [(p, source[p]) for p in positions])
                )
                blocks = [block for _, block in pairs]
                kept.update(((index, p), block) for p, block in pairs if p is not None)
            if groups and groups[-1][0] == index:
                groups[-1][2].extend(blocks)
                groups[-1][3] += 1 if same else 0
            else:
                role = wire.get("role", "user")
                groups.append([index, role, list(blocks), 1 if same else 0])
        out = [self._message(group) for group in groups]
        if appended_system:
            self.payload["system"] = _system_with(self.payload.get("system"), appended_system)
        self.payload["messages"] = out
        _move_breakpoints(self.payload, layout, kept)

    def _message(self, group: list[Any]) -> dict[str, Any]:
        index, role, blocks, unchanged = group
        if index is None:
            return {"role": role, "content": blocks}
        wire = self.layout.messages[index]
        if unchanged == self.layout.parts[index]:
            return wire  # every part of it, unchanged: exactly as sent
        if len(blocks) == 1 and isinstance(blocks[0], str):
            return {**wire, "content": blocks[0]}
        return {**wire, "content": [b for b in blocks if not isinstance(b, str)]}


def _changed(
    data: Mapping[str, Any], blocks: list[tuple[int, dict[str, Any]]]
) -> list[tuple[int | None, dict[str, Any]]]:
    """The blocks of one canonical message a step changed, with the change written onto them,
    each with the position of the block it replaces (None for a block that replaces none)."""
    role = data.get("role")
    content = data.get("content")
    if role == "tool":
        position, block = blocks[0]
        if isinstance(content, list):
            return [(position, {**block, "content": [_wire_block(p) for p in content]})]
        return [(position, {**block, "content": content_text(content)})]
    if role == "assistant":
        text = content_text(content)
        calls = data.get("tool_calls")
        keep = None if calls is None else {c.get("id") for c in calls if isinstance(c, dict)}
        out: list[tuple[int | None, dict[str, Any]]] = []
        written = False
        for position, block in blocks:
            kind = block.get("type")
            if kind == "text":
                if written or not text:
                    continue
                block = {**block, "text": text}
                written = True
            elif kind == "tool_use" and keep is not None and block.get("id") not in keep:
                continue
            out.append((position, block))
        if text and not written:
            out.append((None, {"type": "text", "text": text}))
        return out
    return [(None, block) for block in _wire_blocks(content)]


def _system_of(content: Any) -> Any:
    if isinstance(content, list):
        return [_wire_block(p) for p in content]
    return content_text(content)


def _system_with(system: Any, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(system, list):
        return [*system, *blocks]
    if isinstance(system, str) and system:
        return [{"type": "text", "text": system}, *blocks]
    return blocks


def _system_text(system: Any) -> str | None:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        texts = [b.get("text") for b in system if isinstance(b, dict)]
        return "\n".join(t for t in texts if isinstance(t, str))
    return None


def _move_breakpoints(
    payload: dict[str, Any], layout: Layout, kept: Mapping[tuple[int, int], Any]
) -> None:
    """Keep the prompt-cache breakpoints of removed blocks usable, and at most four in all.

    A removed block's marker moves to the nearest kept block before it (in the messages), so the
    prefix up to there is still cached. Then `_limit_breakpoints` applies Anthropic's rules.
    The client's own lists are never modified: what changes is copied.
    """
    moved: dict[int, dict[str, Any]] = {}  # id of a sent block -> its copy with a marker
    last_kept: tuple[int, int] | None = None
    for index, message in enumerate(layout.messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for p, block in enumerate(content):
            if (index, p) in kept:
                last_kept = (index, p)
                continue
            marker = block.get("cache_control") if isinstance(block, dict) else None
            if marker is None or last_kept is None:
                continue
            target = kept[last_kept]
            if isinstance(target, dict) and target.get("cache_control") is None:
                moved[id(target)] = {**target, "cache_control": marker}
    if moved:
        _replace_blocks(payload, lambda block: moved.get(id(block), block))
    _limit_breakpoints(payload)


def _limit_breakpoints(payload: dict[str, Any]) -> None:
    """At most four markers, and `1h` never after `5m`: later offenders lose their marker."""
    marked: list[Any] = []
    for key in ("tools", "system"):
        value = payload.get(key)
        if isinstance(value, list):
            marked.extend(b for b in value if _marked(b))
    for message in payload["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            marked.extend(b for b in content if _marked(b))
    if len(marked) <= 1:
        return
    seen_short = False
    count = 0
    unmark: set[int] = set()
    for block in marked:
        marker = block["cache_control"]
        ttl = marker.get("ttl", "5m") if isinstance(marker, dict) else "5m"
        if (ttl == "1h" and seen_short) or count >= MAX_BREAKPOINTS:
            unmark.add(id(block))
            continue
        seen_short = seen_short or ttl != "1h"
        count += 1
    if unmark:
        _replace_blocks(
            payload,
            lambda b: (
                {k: v for k, v in b.items() if k != "cache_control"} if id(b) in unmark else b
            ),
        )


def _replace_blocks(payload: dict[str, Any], change: Any) -> None:
    """Apply `change` to every block of tools, system and messages, copying the containers
    whose blocks changed (never the client's own lists)."""
    for key in ("tools", "system"):
        value = payload.get(key)
        if isinstance(value, list):
            new = [change(b) for b in value]
            if any(a is not b for a, b in zip(new, value, strict=True)):
                payload[key] = new
    messages = payload["messages"]
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        new = [change(b) for b in content]
        if any(a is not b for a, b in zip(new, content, strict=True)):
            messages[i] = {**message, "content": new}


def _marked(block: Any) -> bool:
    return isinstance(block, dict) and block.get("cache_control") is not None


def _chat_tool(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """An Anthropic tool definition in the chat shape the counter renders."""
    if "input_schema" not in tool:
        return tool  # a server tool (web search, code execution...): counted as its JSON
    function = {"name": tool.get("name", ""), "parameters": tool["input_schema"]}
    if "description" in tool:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


MESSAGES = MessagesWire()
COUNT_TOKENS = MessagesWire(count_only=True)
