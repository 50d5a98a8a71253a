"""Responses input items parsed to the canonical conversation: everything the model produced
between two other items is one assistant message, each output answers its call, and the
`Layout` says which items made each canonical message. The mapping is described in
`responses.py`."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.conversation import content_text

from ..errors import InvalidRequestError
from .fields import EXTENSION, NO_MARKS, Marks, read_marks, serialise

ROLES = frozenset({"user", "assistant", "system", "developer"})
INSTRUCTIONS = -1  # layout entry of the canonical message made from `instructions`
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text"})
# Model-side items without a call id: the provider ran them (search, code, images, MCP).
ASSISTANT_ITEMS = frozenset({"reasoning", "mcp_list_tools", "mcp_approval_request"})
COMPACTED_NOTE = "[earlier conversation, compacted by the provider]"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each canonical message came from: its items' indices (or INSTRUCTIONS)."""

    items: list[Any]  # the input items as forwarded (our extension stripped)
    spans: list[tuple[int, ...]]
    string_input: bool


class Builder:
    """Folds input items into canonical messages, remembering which items made each one."""

    def __init__(self, stateful: bool) -> None:
        self.stateful = stateful
        self.messages: list[dict[str, Any]] = []
        self.marks: list[Marks] = []
        self.spans: list[tuple[int, ...]] = []
        self.items: list[Any] = []
        self.has_extension = False
        self._open: _Turn | None = None  # the assistant message being folded
        self._leading: list[int] = []  # unknown items before any message
        self._calls: set[str] = set()
        self._call_ids: list[str] = []  # `_calls` in the order the calls came
        # Where a parse may resume: after `ends[k]` items nothing is being folded; `lasts[k]`
        # is then (the latest message's index, that message and its span, has_extension); a
        # later unknown item may replace that message, never one before it. `called[k]`: how
        # many of `_call_ids` had come by then.
        self.ends: list[int] = []
        self.lasts: list[tuple[int, dict[str, Any], tuple[int, ...], bool]] = []
        self.called: list[int] = []

    @classmethod
    def resumed(cls, previous: Builder, count: int, stateful: bool) -> Builder | None:
        """A builder that has read `previous`'s instructions and its items up to the latest
        resume point within the first `count` (None: there is none). Given the same bytes, an
        item's parse depends only on what came before it."""
        k = bisect.bisect_right(previous.ends, count) - 1
        if k < 0 or previous.stateful != stateful:
            return None
        end, (at, last, span, extension) = previous.ends[k], previous.lasts[k]
        builder = cls(stateful)
        builder.messages = [*previous.messages[:at], last]
        builder.marks = previous.marks[: at + 1]
        builder.spans = [*previous.spans[:at], span]
        builder.items = previous.items[:end]
        builder.has_extension = extension
        builder._call_ids = previous._call_ids[: previous.called[k]]
        builder._calls = set(builder._call_ids)
        builder.ends, builder.lasts = previous.ends[: k + 1], previous.lasts[: k + 1]
        builder.called = previous.called[: k + 1]
        return builder

    def instructions(self, text: str) -> None:
        self.messages.append({"role": "system", "content": text})
        self.marks.append(NO_MARKS)
        self.spans.append((INSTRUCTIONS,))

    def item(self, item: Any, index: int, where: str | None) -> None:
        where = where or "input"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where} must be an object.", param=where)
        marks = NO_MARKS
        if EXTENSION in item:
            self.has_extension = True
            marks = read_marks(item[EXTENSION], where)
            item = {k: v for k, v in item.items() if k != EXTENSION}
        at = len(self.items)
        self.items.append(item)
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if not isinstance(kind, str):
            raise InvalidRequestError(f"{where} must have a string `type`.", param=f"{where}.type")
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in ROLES:
                named = f" {role[:40]!r}" if isinstance(role, str) else ""  # never a whole object
                raise InvalidRequestError(
                    f"{where}.role{named} is not one of {', '.join(sorted(ROLES))}.",
                    param=f"{where}.role",
                )
            content = _content(item.get("content"), where)
            if role == "assistant":
                self._turn().add_text(at, content_text(content))
            else:
                self._close()
                self._add({"role": role, "content": content}, marks, [at])
        elif kind == "reasoning":
            self._turn().add_reasoning(at, item)
        elif ("call_id" in item and kind.endswith("_output")) or kind == "mcp_approval_response":
            self._close()
            self._add(self._output(item, kind, where), marks, [at])
        elif "call_id" in item or kind.endswith("_call") or kind in ASSISTANT_ITEMS:
            call = _call(item, kind, where)
            if call is not None:
                self._calls.add(call["id"])
                self._call_ids.append(call["id"])
            self._turn().add_call(at, call, item)
        elif kind == "compaction":
            self._close()
            note = {"role": "user", "content": COMPACTED_NOTE, "compacted": item}
            self._add(note, Marks(pin=True, priority=marks.priority, kind=marks.kind), [at])
        else:
            self._attach(at, item)
        if self._open is None and not self._leading and self.messages:
            self.ends.append(len(self.items))
            last = len(self.messages) - 1
            self.lasts.append((last, self.messages[last], self.spans[last], self.has_extension))
            self.called.append(len(self._call_ids))

    def finish(self) -> None:
        self._close()
        if self._leading:  # nothing to ride along with: they form a message of their own
            self._add({"role": "user", "content": "", "opaque": [
                self.items[i] for i in self._leading
            ]}, Marks(pin=True), self._leading)  # fmt: skip
            self._leading = []

    # -- building blocks ---------------------------------------------------------------------

    def _turn(self) -> _Turn:
        if self._open is None:
            self._open = _Turn()
        return self._open

    def _close(self) -> None:
        if self._open is not None:
            turn, self._open = self._open, None
            self._add(turn.data(), NO_MARKS, turn.indices)

    def _add(self, data: dict[str, Any], marks: Marks, indices: list[int]) -> None:
        if self._leading:
            indices = [*self._leading, *indices]
            data = {**data, "opaque": [*(self.items[i] for i in self._leading)]}
            self._leading = []
        self.messages.append(data)
        self.marks.append(marks)
        self.spans.append(tuple(indices))

    def _attach(self, at: int, item: Any) -> None:
        """An item we do not know rides along with the message before it."""
        if self._open is not None:
            self._open.add_opaque(at, item)
        elif self.spans and self.spans[-1] != (INSTRUCTIONS,):
            last = self.messages[-1]
            self.messages[-1] = {**last, "opaque": [*last.get("opaque", ()), item]}
            self.spans[-1] = (*self.spans[-1], at)
        else:
            self._leading.append(at)

    def _output(self, item: Mapping[str, Any], kind: str, where: str) -> dict[str, Any]:
        key = "approval_request_id" if kind == "mcp_approval_response" else "call_id"
        call_id = item.get(key)
        if not isinstance(call_id, str):
            raise InvalidRequestError(f"{where}.{key} must be a string.", param=f"{where}.{key}")
        if call_id not in self._calls and not self.stateful:
            raise InvalidRequestError(
                f"{where} ({kind}) answers call_id {call_id!r}, but no earlier item makes that "
                "call.",
                param=where,
            )
        if kind == "mcp_approval_response":
            content: Any = f"approve: {item.get('approve')}"
        else:
            content = _output_content(item.get("output"), where)
        return {"role": "tool", "tool_call_id": call_id, "content": content}


class _Turn:
    """What the model produced between two other items: one canonical assistant message."""

    def __init__(self) -> None:
        self.indices: list[int] = []
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.opaque: list[Any] = []

    def add_text(self, at: int, text: str) -> None:
        self.indices.append(at)
        self.texts.append(text)

    def add_reasoning(self, at: int, item: Mapping[str, Any]) -> None:
        self.indices.append(at)
        for part in item.get("summary") or ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                self.reasoning.append(part["text"])
        for part in item.get("content") or ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                self.reasoning.append(part["text"])

    def add_call(self, at: int, call: dict[str, Any] | None, item: Any) -> None:
        self.indices.append(at)
        if call is not None:
            self.calls.append(call)
        else:
            self.opaque.append(item)

    def add_opaque(self, at: int, item: Any) -> None:
        self.indices.append(at)
        self.opaque.append(item)

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "role": "assistant",
            "content": "\n".join(self.texts) if self.texts else None,
        }
        if self.calls:
            data["tool_calls"] = self.calls
        if self.reasoning:
            data["reasoning_content"] = "\n".join(self.reasoning)
        if self.opaque:
            data["opaque"] = self.opaque
        return data


def _call(item: Mapping[str, Any], kind: str, where: str) -> dict[str, Any] | None:
    """The canonical tool call of an item that expects an answer; None for one that does not."""
    call_id = item.get("call_id")
    if call_id is None:
        return None
    if not isinstance(call_id, str):
        raise InvalidRequestError(f"{where}.call_id must be a string.", param=f"{where}.call_id")
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        if not isinstance(name, str):
            raise InvalidRequestError(f"{where}.name must be a string.", param=f"{where}.name")
        if arguments is not None and not isinstance(arguments, str):
            raise InvalidRequestError(
                f"{where}.arguments must be a string.", param=f"{where}.arguments"
            )
    elif kind == "custom_tool_call":
        name, arguments = item.get("name"), item.get("input")
    else:
        name = kind
        rest = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")}
        arguments = serialise(rest).decode()
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": str(name or kind), "arguments": str(arguments or "")},
    }


def _content(content: Any, where: str) -> Any:
    """A message's content as canonical content: the string, or parts the counter knows."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(
            f"{where}.content must be a string or an array of content parts.",
            param=f"{where}.content",
        )
    return [_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)]


def _output_content(output: Any, where: str) -> Any:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return [_part(part, f"{where}.output[{i}]") for i, part in enumerate(output)]
    if isinstance(output, dict):  # e.g. a computer_call_output's screenshot
        return [_part(output, f"{where}.output")]
    if output is None:
        return ""
    raise InvalidRequestError(
        f"{where}.output must be a string or an array of content parts.", param=f"{where}.output"
    )


def _part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise InvalidRequestError(f"{where} must be an object with a string `type`.", param=where)
    kind = part["type"]
    if kind in TEXT_PARTS:
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequestError(f"{where}.text must be a string.", param=f"{where}.text")
        return {"type": "text", "text": text, "source": part}
    if kind == "refusal":
        return {"type": "refusal", "refusal": str(part.get("refusal", "")), "source": part}
    if kind in ("input_image", "computer_screenshot"):
        url = part.get("image_url") or ""
        return {"type": "image_url", "image_url": {"url": url}, "source": part}
    if kind in ("input_file", "input_audio"):
        return {"type": "file", "source": part}
    return {"type": kind, "source": part}
