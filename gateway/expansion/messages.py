"""The expansion tools on Anthropic Messages: offered as tools with an `input_schema`, answered
by the gateway.

The model's call to one of them is a `tool_use` block; the next round appends an assistant
message with what the model produced this round (thinking blocks exactly as they came, with
their signatures; text; the internal `tool_use` blocks) and a user message with a
`tool_result` for each. Calls to the client's own tools made in the same round are left out:
their results would have to come from the client, which has not seen them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..tool_outputs import ToolOutputCache
from .rounds import Call, Carry, HeldRound, add_usage, clashes, json_object, sse
from .whole import Whole, with_usage

USAGE_KEYS = ("input_tokens", "output_tokens")


def applicable(payload: Mapping[str, Any], names: frozenset[str]) -> bool:
    choice = payload.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "none":
        return False
    return not clashes(payload, names)


def with_tools(payload: dict[str, Any], cache: ToolOutputCache) -> dict[str, Any]:
    """The payload plus the expansion tools and one system line saying how to use them."""
    tools = [
        {
            "name": d["function"]["name"],
            "description": d["function"]["description"],
            "input_schema": d["function"]["parameters"],
        }
        for d in cache.tool_definitions()
    ]
    note = {"type": "text", "text": cache.system_note()}
    system = payload.get("system")
    if isinstance(system, list):
        blocks = [*system, note]
    elif isinstance(system, str) and system:
        blocks = [{"type": "text", "text": system}, note]
    else:
        blocks = [note]
    return {**payload, "system": blocks, "tools": [*(payload.get("tools") or []), *tools]}


def internal_calls(content: Sequence[Any], names: frozenset[str]) -> list[Call]:
    return [
        Call(str(b.get("id", "")), b["name"], orjson.dumps(b.get("input") or {}).decode())
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") in names
    ]


def next_payload(
    payload: dict[str, Any],
    content: Sequence[Any],
    calls: Sequence[Call],
    results: Sequence[str],
    names: frozenset[str],
) -> dict[str, Any]:
    produced = [
        b
        for b in content
        if isinstance(b, dict) and not (b.get("type") == "tool_use" and b.get("name") not in names)
    ]
    answered = [
        {"type": "tool_result", "tool_use_id": call.id, "content": result}
        for call, result in zip(calls, results, strict=True)
    ]
    return {
        **payload,
        "messages": [
            *payload["messages"],
            {"role": "assistant", "content": produced},
            {"role": "user", "content": answered},
        ],
    }


def finish(answer: dict[str, Any], names: frozenset[str], usages: Sequence[Any]) -> bytes:
    """The last answer as the client gets it: internal calls removed, usage of every round."""
    content = answer.get("content")
    if isinstance(content, list):
        kept = [
            b
            for b in content
            if not (isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") in names)
        ]
        answer["content"] = kept
        if answer.get("stop_reason") == "tool_use" and not any(
            isinstance(b, dict) and b.get("type") == "tool_use" for b in kept
        ):
            answer["stop_reason"] = "end_turn"
    return with_usage(answer, usages, USAGE_KEYS)


WHOLE = Whole(lambda answer: answer.get("content") or [], internal_calls, next_payload, finish)


class MessagesRound(HeldRound):
    """One streamed message: blocks relayed as they arrive, internal tool_use held back."""

    def __init__(self, number: int, carry: Carry, final: bool, names: frozenset[str]) -> None:
        super().__init__(number, carry, final, names)
        self._blocks: dict[int, dict[str, Any]] = {}  # this round's blocks, being assembled
        self._json: dict[int, list[str]] = {}  # partial tool input per block
        self._hidden = False  # an internal block was removed from what the client sees

    def event(self, raw: bytes, name: bytes, data: bytes) -> bytes | None:
        kind = name.decode("latin-1")
        if kind == "ping":
            return raw
        document = json_object(data)
        if document is None:
            return self._held(raw)
        kind = document.get("type") or kind
        if kind == "message_start":
            message = document.get("message")
            if isinstance(message, dict):
                add_usage(self.carry.usage, message.get("usage"), USAGE_KEYS)
            return raw if self.number == 0 else None
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            return self._block(raw, document, kind)
        if kind == "message_delta":
            usage = document.get("usage")
            if isinstance(usage, dict) and "output_tokens" in usage:
                add_usage(self.carry.usage, {"output_tokens": usage["output_tokens"]}, USAGE_KEYS)
            if self._holding:
                self.calls = internal_calls(self._content(), self.names)
                return None
            if self.number == 0 and not self._hidden:
                return raw
            delta = dict(document.get("delta") or {})
            if delta.get("stop_reason") == "tool_use" and not self.carry.client_calls:
                delta["stop_reason"] = "end_turn"
            document = {**document, "delta": delta}
            if isinstance(usage, dict):
                document["usage"] = {**usage, **self.carry.usage}
            return sse(kind, document)
        return self._held(raw)  # message_stop, error events, unknown ones

    def _block(self, raw: bytes, document: dict[str, Any], kind: str) -> bytes | None:
        index = document.get("index")
        if not isinstance(index, int):
            return self._held(raw)
        if kind == "content_block_start":
            block = document.get("content_block")
            block = dict(block) if isinstance(block, dict) else {}
            self._blocks[index] = block
            if block.get("type") == "tool_use" and block.get("name") in self.names:
                self._internal.add(index)
                self._hidden = True
                self._holding = not self.final
                return None
        elif kind == "content_block_delta":
            self._assemble(index, document.get("delta"))
        if index in self._internal or self._holding:
            return None
        if kind == "content_block_start":
            self.carry.shown += 1
            if self._blocks[index].get("type") == "tool_use":
                self.carry.client_calls += 1
        if self.number == 0 and not self._internal:
            return raw
        document = {**document, "index": self._visible(index)}
        return sse(kind, document)

    def _visible(self, index: int) -> int:
        """The block's index as the client counts: after earlier rounds, internal ones left out."""
        hidden = sum(1 for i in self._internal if i < index)
        return self._offset + index - hidden

    def _assemble(self, index: int, delta: Any) -> None:
        block = self._blocks.get(index)
        if block is None or not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text", ""))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def _content(self) -> list[dict[str, Any]]:
        """This round's blocks as a message would hold them."""
        content = []
        for index in sorted(self._blocks):
            block = dict(self._blocks[index])
            if index in self._json:
                text = "".join(self._json[index])
                try:
                    block["input"] = orjson.loads(text) if text else {}
                except orjson.JSONDecodeError:
                    block["input"] = {}
            content.append(block)
        return content

    def next_payload(self, payload: dict[str, Any], results: Sequence[str]) -> dict[str, Any]:
        return next_payload(payload, self._content(), self.calls, results, self.names)
