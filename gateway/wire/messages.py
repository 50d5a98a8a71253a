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

An agent resends its history every turn: a parse resumes the conversation's previous one after
the messages resent byte for byte (`resent`), and a rewritten message is reused while it would be
made from the very same objects again (`Layout.renders`).
"""

from __future__ import annotations

from bisect import bisect_left
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
    unchanged,
)

if TYPE_CHECKING:
    from policies import Message

    from ..context_errors import ContextError
    from ..tokens import MessageCounter
    from .resent import ResentScope

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
    marked: list[tuple[int, int]]  # (message index, block index) of each cache_control key
    # Any block of `system` or `messages` (nested in a tool result too) has cache_control: the
    # only blocks a rendered conversation is made of, so without one it can carry no marker.
    markers: bool
    # Client message index -> (that message, a step's data for it, the message rendered from
    # both, the marker map entries it made or None): shared by the requests of a conversation
    # (`resent`), so a held result resent with the same objects is not rendered again.
    renders: dict[int, tuple[Any, Any, Any, Any]]


class MessagesWire(Wire):
    name = "messages"
    upstream_path = "/messages"

    def __init__(self, *, count_only: bool = False) -> None:
        self.count_only = count_only  # /v1/messages/count_tokens: no max_tokens, no stream

    def parse(
        self, body: bytes, max_messages: int, resent: ResentScope | None = None
    ) -> WireRequest:
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
        system = payload.get("system")
        seen = None if resent is None else resent.seen(system, raw)
        if seen is not None and seen.state is not None:
            builder = _Builder.resumed(seen.state, seen.same)
        else:
            builder = _Builder()
            builder.system(system)
        for index in range(len(builder.wire_messages), len(raw)):
            builder.message(raw[index], index)
        marks = builder.finish()
        check_tools(payload, "tools")
        if seen is not None and resent is not None:
            resent.keep(seen, builder)
        return WireRequest(
            wire=self,
            body=body,
            payload=payload,
            model=model,
            stream=stream,
            messages=builder.messages,
            marks=marks,
            has_extension=builder.has_extension,
            max_output=max_output,
            layout=Layout(
                builder.wire_messages,
                builder.spans,
                builder.parts,
                builder.marked,
                bool(builder.marked) or builder.nested_markers,
                builder.renders,
            ),
        )

    def render(
        self,
        request: WireRequest,
        messages: Sequence[Message] | None,
        model: str | None,
        inject_usage: bool,
        uids: Sequence[int | None] = (),
    ) -> dict[str, Any]:
        payload = dict(request.payload)
        layout: Layout = request.layout
        if messages is not None:
            _Renderer(request, layout, payload).render(messages, uids)
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


@dataclass(frozen=True, slots=True)
class _State:
    """What `_Builder` has read so far, in sizes of its lists and its running facts."""

    messages: int
    marked: int
    nested_markers: bool
    has_extension: bool
    latest: int
    previous_calls: set[str]


class _Builder:
    """Splits messages into canonical messages, remembering which blocks made each one.

    It runs on every message of every request (an agent resends its whole history), so the
    common blocks are read in straight loops, and the place of an error is spelled out only
    once there is one.
    """

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.marks: list[Marks] = []  # before `finish` pins the latest assistant message
        self.spans: list[tuple[int, tuple[int, ...] | None]] = []
        self.wire_messages: list[Any] = []
        self.parts: list[int] = []
        self.marked: list[tuple[int, int]] = []  # (message, block) of each cache_control marker
        self.nested_markers = False  # a block of `system` or in a tool result has one
        self.has_extension = False
        self._latest = -1  # the canonical message of the latest assistant message
        self._calls: set[str] = set()
        self._previous_calls: set[str] = set()
        # The state after `system` and after each message: where a later parse may resume.
        self.states: list[_State] = []
        self.renders: dict[int, tuple[Any, Any, Any, Any]] = {}  # see `Layout.renders`

    @classmethod
    def resumed(cls, previous: _Builder, count: int) -> _Builder:
        """A builder that has read `previous`'s system and first `count` messages: given the
        same bytes, the parse of a message depends only on what came before it."""
        state = previous.states[count]
        builder = cls()
        builder.messages = previous.messages[: state.messages]
        builder.marks = previous.marks[: state.messages]
        builder.spans = previous.spans[: state.messages]
        builder.wire_messages = previous.wire_messages[:count]
        builder.parts = previous.parts[:count]
        builder.marked = previous.marked[: state.marked]
        builder.nested_markers = state.nested_markers
        builder.has_extension = state.has_extension
        builder._latest = state.latest
        builder._previous_calls = state.previous_calls  # never changed once replaced
        builder.states = previous.states[: count + 1]
        builder.renders = previous.renders
        return builder

    def _save(self) -> None:
        self.states.append(
            _State(
                len(self.messages),
                len(self.marked),
                self.nested_markers,
                self.has_extension,
                self._latest,
                self._previous_calls,
            )
        )

    def system(self, system: Any) -> None:
        if system is not None:
            self._system(system)
        self._save()

    def _system(self, system: Any) -> None:
        if isinstance(system, str):
            content: Any = system
        elif isinstance(system, list):
            content = [_block(_checked(b, f"system[{i}]")) for i, b in enumerate(system)]
            self.nested_markers = any("cache_control" in b for b in system)
        else:
            raise InvalidRequestError(
                "system: must be a string or an array of text blocks.", param="system"
            )
        self.messages.append({"role": "system", "content": content})
        self.marks.append(NO_MARKS)
        self.spans.append((SYSTEM, None))

    def message(self, message: Any, index: int) -> None:
        if type(message) is not dict:
            where = f"messages.{index}"
            raise InvalidRequestError(f"{where}: must be an object.", param=where)
        marks = NO_MARKS
        if EXTENSION in message:
            self.has_extension = True
            marks = read_marks(message[EXTENSION], f"messages[{index}]")
            message = {k: v for k, v in message.items() if k != EXTENSION}
        self.wire_messages.append(message)
        before = len(self.messages)
        role = message.get("role")
        content = message.get("content")
        if role not in ROLES:
            where = f"messages.{index}.role"
            raise InvalidRequestError(
                f"{where}: Input should be 'user' or 'assistant'", param=where
            )
        if type(content) is str:
            self._add({"role": role, "content": content}, marks, (index, None))
        elif type(content) is list:
            if role == "assistant":
                self._assistant(content, index, marks)
            elif role == "user":
                self._user(content, index, marks)
            else:
                self._scan(content, index)
                data = {"role": role, "content": [_block(b) for b in content]}
                self._add(data, marks, (index, _positions(len(content))))
        else:
            where = f"messages.{index}.content"
            raise InvalidRequestError(
                f"{where}: must be a string or an array of content blocks.", param=where
            )
        self.parts.append(len(self.messages) - before)
        if role == "assistant":
            self._latest = before
            self._previous_calls = self._calls
            self._calls = set()
        self._save()

    def finish(self) -> list[Marks]:
        """The marks, with the latest assistant message pinned: its thinking goes back exactly
        as it came. (A copy: `marks` stays as read, for a later parse to resume from.)"""
        if self._latest < 0:
            return self.marks
        marks = list(self.marks)
        latest = marks[self._latest]
        marks[self._latest] = Marks(pin=True, priority=latest.priority, kind=latest.kind)
        return marks

    def _assistant(self, blocks: list[Any], index: int, marks: Marks) -> None:
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[dict[str, Any]] = []
        opaque: list[Any] = []
        for position, block in enumerate(blocks):
            kind = _kind(block, index, position)
            if "cache_control" in block:
                self.marked.append((index, position))
            if kind == "tool_use":
                call_id = block.get("id")
                if type(call_id) is not str:
                    raise InvalidRequestError("tool_use.id: Field required", param="messages")
                self._calls.add(call_id)
                name = block.get("name", "")
                function = {
                    "name": name if type(name) is str else str(name),
                    "arguments": orjson.dumps(block.get("input", {})).decode(),
                }
                calls.append({"id": call_id, "type": "function", "function": function})
            elif kind == "text":
                text = block.get("text", "")
                texts.append(text if type(text) is str else str(text))
            elif kind == "thinking":
                text = block.get("thinking", "")
                thinking.append(text if type(text) is str else str(text))
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
        self._add(data, marks, (index, _positions(len(blocks))))

    def _user(self, blocks: list[Any], index: int, marks: Marks) -> None:
        rest: list[int] = []
        for position, block in enumerate(blocks):
            kind = _kind(block, index, position)
            if "cache_control" in block:
                self.marked.append((index, position))
            if kind != "tool_result":
                rest.append(position)
                continue
            call_id = block.get("tool_use_id")
            if type(call_id) is not str:
                where = f"messages.{index}.content.{position}.tool_use_id"
                raise InvalidRequestError(f"{where}: Field required", param=where)
            if call_id not in self._previous_calls:
                where = f"messages.{index}.content.{position}"
                raise InvalidRequestError(
                    f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{call_id}. Each `tool_result` block must have a corresponding `tool_use` "
                    "block in the previous message.",
                    param=where,
                )
            content = block.get("content")
            if type(content) is list:
                where = f"messages.{index}"
                content = [_block(_checked(b, where)) for b in content if type(b) is dict]
                if any("cache_control" in part["source"] for part in content):
                    self.nested_markers = True
            data = {"role": "tool", "tool_call_id": call_id, "content": content or ""}
            self._add(data, marks, (index, (position,)))
        if len(rest) == len(blocks):  # no tool results (or no blocks): one user message
            data = {"role": "user", "content": [_block(b) for b in blocks]}
            self._add(data, marks, (index, _positions(len(rest))))
        elif rest:
            data = {"role": "user", "content": [_block(blocks[p]) for p in rest]}
            self._add(data, marks, (index, tuple(rest)))

    def _scan(self, blocks: list[Any], index: int) -> None:
        """Check each block has a type, and note the ones that carry a cache marker."""
        for position, block in enumerate(blocks):
            _kind(block, index, position)
            if "cache_control" in block:
                self.marked.append((index, position))

    def _add(
        self, data: dict[str, Any], marks: Marks, span: tuple[int, tuple[int, ...] | None]
    ) -> None:
        self.messages.append(data)
        self.marks.append(marks)
        self.spans.append(span)


_POSITIONS = [tuple(range(n)) for n in range(64)]


def _positions(count: int) -> tuple[int, ...]:
    """(0, 1, ... count - 1), shared: most messages have a handful of blocks."""
    return _POSITIONS[count] if count < len(_POSITIONS) else tuple(range(count))


def _kind(block: Any, index: int, position: int) -> str:
    """A content block's `type`; a 400 naming the block when it has none."""
    if type(block) is dict:
        kind = block.get("type")
        if type(kind) is str:
            return kind
    where = f"messages.{index}.content.{position}"
    raise InvalidRequestError(f"{where}.type: Field required", param=where)


def _checked(block: Any, where: str) -> dict[str, Any]:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidRequestError(f"{where}.type: Field required", param=where)
    return block


def _block(block: dict[str, Any]) -> dict[str, Any]:
    """A checked content block as a canonical part the counter and the policies understand."""
    kind = block["type"]
    if kind == "text":
        text = block.get("text", "")
        return {"type": "text", "text": text if type(text) is str else str(text), "source": block}
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
    """Puts a compacted canonical conversation back into messages and blocks.

    The canonical messages made from one client message come one after the other; they are
    regrouped into it. A client message whose canonical messages all came back unchanged is
    forwarded as the client's own object; the usual one (a single canonical message) is
    recognised without regrouping.
    """

    def __init__(self, request: WireRequest, layout: Layout, payload: dict[str, Any]) -> None:
        self.layout = layout
        self.originals = request.messages
        self.payload = payload
        self.out: list[Any] = []
        # (message, block) -> the block sent there; only needed to move cache markers
        self.kept: dict[tuple[int, int], Any] | None = {} if layout.marked else None
        self._index = -1  # the client message being regrouped (-1: none)
        self._group: list[Any] = []  # its blocks so far
        self._unchanged = 0  # its canonical messages that came back unchanged

    def render(self, messages: Sequence[Message], uids: Sequence[int | None]) -> None:
        layout, originals, out, kept = self.layout, self.originals, self.out, self.kept
        spans, parts, wires = layout.spans, layout.parts, layout.messages
        appended_system: list[dict[str, Any]] = []
        for message, same in zip(messages, unchanged(messages, originals, uids), strict=True):
            origin = message.origin
            if origin < 0:
                if message.role == "system":
                    appended_system.extend(_wire_blocks(message.data.get("content")))
                else:
                    self._flush()
                    role = "assistant" if message.role == "assistant" else "user"
                    out.append({"role": role, "content": _wire_blocks(message.data.get("content"))})
                continue
            index, positions = spans[origin]
            data = message.data
            if index == SYSTEM:
                if not same:
                    self.payload["system"] = _system_of(data.get("content"))
            elif parts[index] == 1:  # the only canonical message of its client message
                if self._index >= 0:
                    self._flush()
                wire = wires[index]
                if same:
                    out.append(wire)
                    if kept is not None and positions is not None:
                        content = wire["content"]
                        kept.update(((index, p), content[p]) for p in positions)
                elif positions is None:  # string content
                    out.append({**wire, "content": content_text(data.get("content"))})
                else:
                    out.append(self._rebuilt(index, positions, data, wire))
            elif index == self._index:  # (a message of several parts has blocks, no string)
                self._group.extend(self._blocks(index, positions or (), data, same))
                self._unchanged += same
            else:
                self._flush()
                self._index, self._unchanged = index, int(same)
                self._group = self._blocks(index, positions or (), data, same)
        self._flush()
        if appended_system:
            self.payload["system"] = _system_with(self.payload.get("system"), appended_system)
        self.payload["messages"] = out
        if kept is not None:
            _move_breakpoints(self.payload, layout, kept)
        _limit_breakpoints(self.payload, layout.markers)

    def _rebuilt(
        self, index: int, positions: tuple[int, ...], data: Mapping[str, Any], wire: Any
    ) -> Any:
        """Client message `index`, made of one canonical message a step changed (`data`), with
        its blocks rewritten. A pure function of the two objects: the render of an earlier
        request of the conversation is reused when it had these very objects."""
        kept, renders = self.kept, self.layout.renders
        hit = renders.get(index)
        if hit is not None and hit[0] is wire and hit[1] is data:
            if kept is None:
                return hit[2]
            if hit[3] is not None:
                kept.update(hit[3])
                return hit[2]
        made: dict[tuple[int, int], Any] | None = None if kept is None else {}
        self.kept = made
        rebuilt = {**wire, "content": self._blocks(index, positions, data, False)}
        self.kept = kept
        if kept is not None and made is not None:
            kept.update(made)
        renders[index] = (wire, data, rebuilt, None if made is None else tuple(made.items()))
        return rebuilt

    def _blocks(
        self, index: int, positions: tuple[int, ...], data: Mapping[str, Any], same: bool
    ) -> list[dict[str, Any]]:
        """The blocks one canonical message puts back into client message `index`."""
        source, kept = self.layout.messages[index]["content"], self.kept
        if same:
            blocks = [source[p] for p in positions]
            if kept is not None:
                kept.update(((index, p), source[p]) for p in positions)
            return blocks
        if data.get("role") == "tool":  # one tool result, its content changed (masked, cut)
            position = positions[0]
            block = _result(source[position], data.get("content"))
            if kept is not None:
                kept[(index, position)] = block
            return [block]
        pairs = _changed(data, [(p, source[p]) for p in positions])
        if kept is not None:
            kept.update(((index, p), block) for p, block in pairs if p is not None)
        return [block for _, block in pairs]

    def _flush(self) -> None:
        """Close the client message being regrouped."""
        index = self._index
        if index < 0:
            return
        self._index = -1
        wire = self.layout.messages[index]
        if self._unchanged == self.layout.parts[index]:
            self.out.append(wire)  # every part of it, unchanged: exactly as sent
        else:
            self.out.append({**wire, "content": self._group})


def _result(block: Mapping[str, Any], content: Any) -> dict[str, Any]:
    """A `tool_result` block with the content a step gave its tool message."""
    if isinstance(content, list):
        return {**block, "content": [_wire_block(p) for p in content]}
    return {**block, "content": content_text(content)}


def _changed(
    data: Mapping[str, Any], blocks: list[tuple[int, dict[str, Any]]]
) -> list[tuple[int | None, dict[str, Any]]]:
    """The blocks of one canonical message a step changed, with the change written onto them,
    each with the position of the block it replaces (None for a block that replaces none)."""
    role = data.get("role")
    content = data.get("content")
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
    """Keep the prompt-cache breakpoints of removed blocks usable.

    A removed block's marker moves to the nearest kept block before it (in the messages), so the
    prefix up to there is still cached. The client's own lists are never modified: what changes
    is copied.
    """
    moved: dict[int, dict[str, Any]] = {}  # id of a sent block -> its copy with a marker
    order: list[tuple[int, int]] | None = None
    for index, position in layout.marked:
        if (index, position) in kept:
            continue
        marker = layout.messages[index]["content"][position].get("cache_control")
        if marker is None:
            continue
        if order is None:
            order = sorted(kept)
        before = bisect_left(order, (index, position))
        if before == 0:
            continue
        target = kept[order[before - 1]]
        if isinstance(target, dict) and target.get("cache_control") is None:
            moved[id(target)] = {**target, "cache_control": marker}
    if moved:
        _replace_blocks(payload, lambda block: moved.get(id(block), block))


def _limit_breakpoints(payload: dict[str, Any], in_messages: bool) -> None:
    """At most four markers, and `1h` never after `5m`: later offenders lose their marker.

    `in_messages`: the messages may carry markers (else only tools and system are read).
    """
    marked: list[Any] = []
    for key in ("tools", "system"):
        value = payload.get(key)
        if isinstance(value, list):
            marked.extend(b for b in value if _marked(b))
    for message in payload["messages"] if in_messages else ():
        content = message["content"]
        if type(content) is list:
            # every sent block is a dict: checked on the way in, or made by us
            marked.extend([b for b in content if b.get("cache_control") is not None])
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
