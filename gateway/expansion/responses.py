"""The expansion tools on the Responses API: offered as function tools, answered by the gateway.

The model's call to one of them is a `function_call` output item; the next round's input is the
history, this round's reasoning and messages, the internal calls and their
`function_call_output` items (a reasoning item travels with the call after it, as the provider
requires). Calls to the client's own tools made in the same round are not shown to the client
and not sent back: the model, asked again, makes them again if it still needs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..tool_outputs import ToolOutputCache
from .rounds import Call, Carry, HeldRound, add_usage, clashes, json_object, sse
from .whole import Whole, with_usage

USAGE_KEYS = ("input_tokens", "output_tokens", "total_tokens")
PREAMBLE = frozenset({"response.created", "response.in_progress", "response.queued"})
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def applicable(payload: Mapping[str, Any], names: frozenset[str]) -> bool:
    if payload.get("tool_choice") == "none":
        return False
    return not clashes(payload, names)


def with_tools(payload: dict[str, Any], cache: ToolOutputCache) -> dict[str, Any]:
    """The payload plus the expansion tools and one developer line saying how to use them."""
    tools = [
        {"type": "function", **definition["function"], "strict": False}
        for definition in cache.tool_definitions()
    ]
    note = {"type": "message", "role": "developer", "content": cache.system_note()}
    items = payload.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    return {
        **payload,
        "input": [note, *(items or [])],
        "tools": [*(payload.get("tools") or []), *tools],
    }


def internal_calls(output: Sequence[Any], names: frozenset[str]) -> list[Call]:
    return [
        Call(str(item.get("call_id", "")), item["name"], str(item.get("arguments") or ""))
        for item in output
        if isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("name") in names
    ]


def next_payload(
    payload: dict[str, Any],
    output: Sequence[Any],
    calls: Sequence[Call],
    results: Sequence[str],
    names: frozenset[str],
) -> dict[str, Any]:
    """History + what the model produced this round (but client calls) + the internal results."""
    produced = [
        item
        for item in output
        if isinstance(item, dict)
        and not (item.get("type") == "function_call" and item.get("name") not in names)
        and not ("call_id" in item and item.get("type") != "function_call")
    ]
    answered = [
        {"type": "function_call_output", "call_id": call.id, "output": result}
        for call, result in zip(calls, results, strict=True)
    ]
    items = payload.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    return {**payload, "input": [*(items or []), *produced, *answered]}


def finish(answer: dict[str, Any], names: frozenset[str], usages: Sequence[Any]) -> bytes:
    """The last answer as the client gets it: internal calls removed, usage of every round."""
    output = answer.get("output")
    if isinstance(output, list):
        answer["output"] = [
            i
            for i in output
            if not (
                isinstance(i, dict) and i.get("type") == "function_call" and i.get("name") in names
            )
        ]
    return with_usage(answer, usages, USAGE_KEYS)


WHOLE = Whole(lambda answer: answer.get("output") or [], internal_calls, next_payload, finish)


class ResponsesRound(HeldRound):
    """One streamed Responses answer: relayed event by event, internal calls held back."""

    def __init__(self, number: int, carry: Carry, final: bool, names: frozenset[str]) -> None:
        super().__init__(number, carry, final, names)
        self._output: list[Any] = []  # this round's finished output items (all of them)

    def event(self, raw: bytes, name: bytes, data: bytes) -> bytes | None:
        document = json_object(data)
        if document is None:
            return self._held(raw)
        kind = document.get("type") or name.decode("latin-1")
        if kind in PREAMBLE:
            if self.number == 0:
                response = document.get("response")
                if isinstance(response, dict):
                    self.carry.first = {k: response.get(k) for k in ("id", "created_at")}
                return self._pass(raw, document, kind)
            return None
        if kind in TERMINAL:
            return self._terminal(raw, document, kind)
        index = document.get("output_index")
        if isinstance(index, int):
            if kind == "response.output_item.added":
                item = document.get("item")
                if isinstance(item, dict) and item.get("type") == "function_call":
                    if item.get("name") in self.names:
                        self._internal.add(index)
                        self._holding = not self.final
                        return None
            if kind == "response.output_item.done" and isinstance(document.get("item"), dict):
                self._output.append(document["item"])
            if index in self._internal or self._holding:
                return None
            if kind == "response.output_item.done":
                self.carry.items.append(document.get("item"))
                if document["item"].get("type") == "function_call":
                    self.carry.client_calls += 1
            if kind == "response.output_item.added":
                self.carry.shown += 1
            if self.number or self._internal:
                hidden = sum(1 for i in self._internal if i < index)
                document["output_index"] = self._offset + index - hidden
            return self._pass(raw, document, kind)
        if self._holding:
            return None
        return self._pass(raw, document, kind)

    def _pass(self, raw: bytes, document: dict[str, Any], kind: str) -> bytes:
        """Relay an event: as it came in the first round, renumbered in later ones."""
        if self.number == 0 and not self._internal:
            sequence = document.get("sequence_number")
            if isinstance(sequence, int):
                self.carry.sequence = sequence + 1
            return raw
        if "sequence_number" in document:
            document["sequence_number"] = self.carry.sequence
            self.carry.sequence += 1
        return sse(kind, document)

    def _terminal(self, raw: bytes, document: dict[str, Any], kind: str) -> bytes | None:
        response = document.get("response")
        if not isinstance(response, dict):
            return self._held(raw)
        output = response.get("output")
        if isinstance(output, list) and not self._output:
            self._output = list(output)
        add_usage(self.carry.usage, response.get("usage"), USAGE_KEYS)
        if self._holding:
            self.calls = internal_calls(self._output, self.names)
            return None
        if self.number == 0 and not self._internal:
            return raw
        response = dict(response)
        response.update({k: v for k, v in self.carry.first.items() if v is not None})
        response["output"] = [i for i in self.carry.items if i is not None]
        if isinstance(response.get("usage"), dict):
            response["usage"] = {**response["usage"], **self.carry.usage}
        document = {**document, "response": response}
        if self.number == 0:
            return sse(kind, document)
        return self._pass(raw, document, kind)

    def next_payload(self, payload: dict[str, Any], results: Sequence[str]) -> dict[str, Any]:
        return next_payload(payload, self._output, self.calls, results, self.names)
