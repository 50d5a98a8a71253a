"""Recognising a coding agent's own compaction request.

Agents compact their history themselves with an ordinary model call: the whole history, then a
last user message asking for a summary. Codex CLI's begins "You are performing a CONTEXT
CHECKPOINT COMPACTION" (Responses API, no tools); Claude Code's `/compact` and auto-compaction
end the history with a user text that forbids tool calls and asks for "a detailed summary of the
conversation so far" (Messages API, tools still listed). The gateway tells these apart from
ordinary turns by a list of signatures, configurable (`agent_compaction.signatures`), shipped
with defaults, each written from a request captured from the real agent
(`tests/fixtures/agents/`).

A signature matches on the latest user message only (an earlier compaction's prompt further up
the history is not a new request), on its text's start and optionally a phrase it contains,
and on the API when it names one. What a match changes: the response says so
(`x-compactgate-agent-compaction`), the event log and `compactgate_agent_compactions_total`
count it, and the gateway remembers per tenant how large the history was when that agent
compacted (where its next compaction will come).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from policies.conversation import content_text

from ..config import DEFAULT_SIGNATURES, Signature

MAX_TENANTS = 4096


def latest_user_text(messages: Sequence[Any]) -> str:
    """The text of the last canonical message with role `user` (stripped), or ''."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return content_text(message.get("content")).strip()
    return ""


def recognise(
    api: str, messages: Sequence[Any], signatures: Sequence[Signature] = DEFAULT_SIGNATURES
) -> Signature | None:
    """The signature the request's latest user message matches, if any."""
    text = latest_user_text(messages)
    if not text:
        return None
    for signature in signatures:
        if signature.api is not None and signature.api != api:
            continue
        if not text.startswith(signature.starts_with):
            continue
        if signature.contains is not None and signature.contains not in text:
            continue
        return signature
    return None


class CompactionPoints:
    """Per tenant and agent: the history size at the agent's latest compaction request."""

    def __init__(self, max_tenants: int = MAX_TENANTS) -> None:
        self._points: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._max = max_tenants

    def seen(self, tenant: str, agent: str, tokens: int) -> None:
        self._points[(tenant, agent)] = tokens
        self._points.move_to_end((tenant, agent))
        while len(self._points) > self._max:
            self._points.popitem(last=False)

    def point(self, tenant: str, agent: str) -> int | None:
        return self._points.get((tenant, agent))
