"""The invariants every forwarded request keeps (design D1), checked in one place.

Used by the property tests and, cheaply, by the gateway before anything is forwarded: a
compacted request that breaks one of these is never sent.

- system/developer prompts are kept, in order, unchanged (a summary may be appended to the
  first one when placement is `system_append`: its original text must stay a prefix).
- every assistant tool call is answered by exactly one tool result that follows it before
  the next assistant/user message, and every tool result answers such a call.
- the latest user message is kept unchanged (unless recovery truncated it: `allow_truncated`).
- pinned messages are kept.
- messages that come from the client keep their relative order.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .conversation import PROTECTED_ROLES, Conversation, Message, content_text, is_mapping

# Rule names, as operators see them (the `rule` label of compactgate_invariant_violations_total
# and the log line of a refused compaction), each with its item in docs/design.md.
SYSTEM_PROMPTS_KEPT = "system_prompts_kept"  # design D1.1
TOOL_CALLS_PAIRED = "tool_calls_paired"  # design D1.2
LATEST_USER_MESSAGE_KEPT = "latest_user_message_kept"  # design D1.3
PINNED_MESSAGES_KEPT = "pinned_messages_kept"  # design D1.4
CLIENT_ORDER_KEPT = "client_order_kept"  # design D1.5


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str  # one of the rule names above
    message: str


def check(
    original: Conversation, result: Conversation, *, allow_truncated: bool = False
) -> list[Violation]:
    """Every invariant `result` breaks relative to `original`; empty when it is valid."""
    violations = check_tool_pairs(result.data())
    violations += _check_order(result)
    have = {m.origin: m for m in result.messages if m.origin >= 0}
    violations += _check_system(original, have)
    violations += _check_kept(original, have, allow_truncated)
    return violations


def check_tool_pairs(messages: Sequence[Mapping[str, Any]]) -> list[Violation]:
    """Tool calls paired by OpenAI's rules: results directly follow their call, one per call id."""
    violations: list[Violation] = []
    open_ids: set[str] = set()
    answered: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = str(message.get("tool_call_id", ""))
            if call_id not in open_ids:
                violations.append(
                    Violation(
                        TOOL_CALLS_PAIRED,
                        f"messages[{i}]: tool result {call_id!r} has no pending call",
                    )
                )
            open_ids.discard(call_id)
            answered.add(call_id)
            continue
        if open_ids:
            violations.append(
                Violation(
                    TOOL_CALLS_PAIRED,
                    f"messages[{i}]: tool calls {sorted(open_ids)} left without results",
                )
            )
            open_ids = set()
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                call_id = str(call.get("id", "")) if is_mapping(call) else ""
                if call_id in answered or call_id in open_ids:
                    violations.append(
                        Violation(
                            TOOL_CALLS_PAIRED, f"messages[{i}]: duplicate tool call id {call_id!r}"
                        )
                    )
                open_ids.add(call_id)
    if open_ids:
        violations.append(
            Violation(
                TOOL_CALLS_PAIRED, f"tool calls {sorted(open_ids)} at the end have no results"
            )
        )
    return violations


def _check_order(result: Conversation) -> list[Violation]:
    origins = [m.origin for m in result.messages if m.origin >= 0]
    if any(b <= a for a, b in itertools.pairwise(origins)):
        return [Violation(CLIENT_ORDER_KEPT, "client messages are out of order or duplicated")]
    return []


def _check_system(original: Conversation, have: Mapping[int, Message]) -> list[Violation]:
    roles = original.roles()
    want = [m for m, role in zip(original.messages, roles, strict=True) if role in PROTECTED_ROLES]
    violations = []
    for message in want:
        kept = have.get(message.origin)
        if kept is None:
            violations.append(
                Violation(
                    SYSTEM_PROMPTS_KEPT, f"{message.role} message {message.origin} was dropped"
                )
            )
            continue
        if kept.data != message.data:
            old, new = (
                content_text(message.data.get("content")),
                content_text(kept.data.get("content")),
            )
            if not (new.startswith(old) and _same_but_content(message.data, kept.data)):
                violations.append(
                    Violation(
                        SYSTEM_PROMPTS_KEPT, f"{message.role} message {message.origin} was changed"
                    )
                )
    return violations


def _check_kept(
    original: Conversation, have: Mapping[int, Message], allow_truncated: bool
) -> list[Violation]:
    violations = []
    latest = original.latest_user_index()
    if latest is not None:
        message = original.messages[latest]
        kept = have.get(message.origin)
        if kept is None:
            violations.append(
                Violation(LATEST_USER_MESSAGE_KEPT, "the latest user message was dropped")
            )
        elif kept.data != message.data and not allow_truncated:
            violations.append(
                Violation(LATEST_USER_MESSAGE_KEPT, "the latest user message was changed")
            )
    for message in original.messages:
        if message.pin and message.origin not in have:
            violations.append(
                Violation(PINNED_MESSAGES_KEPT, f"pinned message {message.origin} was dropped")
            )
    return violations


def _same_but_content(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k != "content"} == {
        k: v for k, v in b.items() if k != "content"
    }
