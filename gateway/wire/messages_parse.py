"""Anthropic Messages parsed to the canonical conversation: each wire message's blocks become
canonical messages (tool results before the rest of a user message, one assistant message with
its tool calls), with the `Layout` rendering needs to group them back. The mapping is described
in `messages.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from .fields import EXTENSION, NO_MARKS, Marks, read_marks, serialise

ROLES = frozenset({"user", "assistant", "system"})
SYSTEM = -1  # layout entry of the canonical message made from the top-level `system`


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


@dataclass(frozen=True, slots=True)
class _State:
    """What `Builder` has read so far, in sizes of its lists and its running facts."""

    messages: int
    marked: int
    nested_markers: bool
    has_extension: bool
    latest: int
    previous_calls: set[str]


class Builder:
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
    def resumed(cls, previous: Builder, count: int) -> Builder:
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
        if type(role) is not str or role not in ROLES:  # (a list is no role, and unhashable)
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
                    "arguments": serialise(block.get("input", {})).decode(),
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
