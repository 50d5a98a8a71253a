"""Wire adapters: one per client API, all on one request path.

    chat       POST /v1/chat/completions   (the canonical form is this API's own)
    responses  POST /v1/responses
    messages   POST /v1/messages, POST /v1/messages/count_tokens

Each adapter parses its API into the canonical conversation the policies work on and renders
the result back; see `base.Wire` for everything an adapter answers for.
"""

import orjson

from ..errors import InvalidRequestError
from .base import Wire, WireRequest
from .chat import CHAT, parse_chat_request
from .fields import Marks
from .messages import COUNT_TOKENS, MESSAGES
from .responses import RESPONSES
from .usage import Usage, UsageTap

WIRES: dict[str, Wire] = {wire.name: wire for wire in (CHAT, RESPONSES, MESSAGES)}
ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})


def wire_of(body: bytes, api: str | None = None) -> Wire:
    """The adapter for a body whose API is not known from its path (plan, `compactgate plan`):
    `api` when given, else guessed from the body's shape (chat unless it looks otherwise)."""
    if api is not None:
        wire = WIRES.get(api)
        if wire is None:
            raise InvalidRequestError(
                f"`api` must be one of {', '.join(sorted(WIRES))}.", param="api"
            )
        return wire
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return CHAT  # its parser reports the JSON error
    if not isinstance(payload, dict):
        return CHAT
    if "input" in payload or "instructions" in payload:
        return RESPONSES
    if "system" in payload:
        return MESSAGES
    for message in payload.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in ANTHROPIC_BLOCKS for b in content
        ):
            return MESSAGES
    return CHAT


__all__ = [
    "CHAT",
    "COUNT_TOKENS",
    "MESSAGES",
    "RESPONSES",
    "WIRES",
    "Marks",
    "Usage",
    "UsageTap",
    "Wire",
    "WireRequest",
    "parse_chat_request",
    "wire_of",
]
