"""Which messages are important (design D5.12): the client's marks and the operator's pin rules.

Two sources, both pure:

- The client's marks: the per-message extension `"compactgate": {"pin", "priority", "type"}`,
  validated and stripped by the wire adapters (`gateway.wire.request.read_marks`), reaches the
  policies as each `Message`'s `pin`, `priority` (1..3, 1 the highest) and `kind`.
- Config rules `pin_rules: [{role?, tool_name?, content_regex?}]`: a message is pinned when it
  matches every field a rule sets (a rule that sets none matches nothing). `tool_name` matches a
  tool result answering a call to that function and an assistant message calling it;
  `content_regex` is searched in the message's text. `apply_pin_rules` returns new messages.

Pinned messages are never dropped, summarised away or rewritten by any step; a pinned tool
result or call keeps its whole tool group.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from .conversation import Message, is_mapping


class PinRuleLike(Protocol):
    @property
    def role(self) -> str | None: ...

    @property
    def tool_name(self) -> str | None: ...

    @property
    def content_regex(self) -> str | None: ...


class PinRule(BaseModel):
    """One `pin_rules` entry; every field it sets must match."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: str | None = None
    tool_name: str | None = None
    content_regex: str | None = None

    @field_validator("content_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> PinRule:
        if self.role is None and self.tool_name is None and self.content_regex is None:
            raise ValueError("a pin rule needs at least one of role, tool_name, content_regex")
        return self


def apply_pin_rules(
    messages: Sequence[Message], rules: Sequence[PinRuleLike]
) -> tuple[Message, ...]:
    """`messages` with `pin=True` on every message some rule matches."""
    if not rules:
        return tuple(messages)
    names = call_names(messages)
    out = []
    for message in messages:
        if not message.pin and any(_matches(message, rule, names) for rule in rules):
            message = replace(message, pin=True)
        out.append(message)
    return tuple(out)


def _matches(message: Message, rule: PinRuleLike, names: Mapping[str, str]) -> bool:
    if rule.role is None and rule.tool_name is None and rule.content_regex is None:
        return False
    if rule.role is not None and message.role != rule.role:
        return False
    if rule.tool_name is not None and rule.tool_name not in _tool_names(message, names):
        return False
    return rule.content_regex is None or re.search(rule.content_regex, message.text) is not None


def _tool_names(message: Message, names: Mapping[str, str]) -> set[str]:
    if message.role == "tool":
        found = {names.get(str(message.data.get("tool_call_id", "")), "")}
        if isinstance(message.data.get("name"), str):
            found.add(message.data["name"])
        return found
    return {
        str(call["function"].get("name", ""))
        for call in message.data.get("tool_calls") or ()
        if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping)
    }


def call_names(messages: Sequence[Message]) -> dict[str, str]:
    """tool_call_id -> function name, from the assistant messages' tool_calls."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.data.get("tool_calls") or ():
            if is_mapping(call) and is_mapping(function := call.get("function")):
                names[str(call.get("id", ""))] = str(function.get("name", ""))
    return names
