"""A message list in its provider's own shape, without the request around it (design D9.10).

`POST /v1/compress` and the LiteLLM callback are handed a conversation, not a request: a
`messages` array as OpenAI chat, Anthropic Messages or the Responses API writes it, and a model
name. The rule this module owns: the shape is told from the messages themselves, the list is
parsed and rendered back by that API's own adapter (so it is compacted exactly as the same
conversation is on that API's endpoint, and answered with the same bytes), and what comes back
is a list in the shape that went in.

Telling the shapes apart. The fields only one API has decide:
- OpenAI chat: a `tool`, `function` or `developer` role, `tool_calls`, `tool_call_id`,
  `function_call`, or a content part of type `image_url`, `input_audio`, `file`, `refusal`.
- Anthropic Messages: a content block of type `tool_use`, `tool_result`, `thinking`,
  `redacted_thinking`, `document`, `image` with a `source`, a server tool's blocks, `compaction`,
  or any block carrying `cache_control`.
- Responses: an item with a `type` (`message`, `function_call`, `function_call_output`,
  `reasoning`, ...; whatever its role) or a content part of type `input_text`, `output_text`,
  `input_image`.
A list with the marks of two APIs is refused (400); a list with none (plain text from users and
assistants) reads the same in every API and is parsed as chat.

The system prompt: agentgateway never sends Anthropic's top-level `system` (nor Responses'
`instructions`), so a conversation may come without one. What a step adds there (a summary or
the ledger, D5.3, D5.11) then has nowhere in the list to go as a system prompt: it is answered
as a leading user message of text blocks (Anthropic accepts consecutive user turns). A caller
that hands the system prompt over too (the LiteLLM callback) gets it back in its own field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..errors import InvalidRequestError
from .base import Wire, WireRequest
from .chat import CHAT
from .fields import load_object, read_model
from .messages import COUNT_TOKENS
from .responses import RESPONSES

CHAT_ROLES = frozenset({"tool", "function", "developer"})
CHAT_FIELDS = ("tool_calls", "tool_call_id", "function_call")
CHAT_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
ANTHROPIC_BLOCKS = frozenset(
    {
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "document",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "search_result",
        "container_upload",
        "compaction",
    }
)
RESPONSES_PARTS = frozenset({"input_text", "output_text", "input_image", "input_file"})

# The field holding the conversation in each API's request body, and its system prompt's.
LIST_FIELD = {"chat": "messages", "messages": "messages", "responses": "input"}
SYSTEM_FIELD = {"chat": None, "messages": "system", "responses": "instructions"}
WIRE: dict[str, Wire] = {"chat": CHAT, "messages": COUNT_TOKENS, "responses": RESPONSES}


def answer(request: WireRequest, body: bytes) -> tuple[list[Any], Any]:
    """The conversation the engine decided to send (`body`: `Prepared.body` for `request`, a
    request `native` made), in the shape it came in: its list, and its system prompt (None when
    the caller handed none over)."""
    shape = request.api
    field, key = LIST_FIELD[shape], SYSTEM_FIELD[shape]
    given = request.payload.get(key) if key is not None else None
    if body is request.body:  # unchanged
        return request.payload[field], given
    payload = orjson.loads(body)
    messages = payload.get(field)
    assert isinstance(messages, list)
    system = payload.get(key) if key is not None else None
    if given is None and system is not None:
        messages = [_leading_user(shape, system), *messages]
        system = None
    return messages, system


def parse_native(
    body: bytes, max_messages: int, extra: Mapping[str, Any] | None = None
) -> WireRequest:
    """`{"messages": [...], "model": "..."}` (agentgateway's contract) as a parsed request of
    the API the messages are written in. `extra`: fields of that API's request to parse with
    them (tools, the output limit, the system prompt: what changes the budget)."""
    payload = load_object(body)
    model = read_model(payload)
    messages = payload.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequestError("`messages` is required and must be an array.", param="messages")
    if not messages:
        raise InvalidRequestError("`messages` must contain at least one message.", param="messages")
    return native(model, messages, max_messages, extra)


def native(
    model: str,
    messages: list[Any],
    max_messages: int,
    extra: Mapping[str, Any] | None = None,
    api: str | None = None,
) -> WireRequest:
    """`messages` for `model` parsed by the adapter of the API they are written in, as that
    API's endpoint parses them (`extra`: more of that API's request fields; `api`: the API the
    caller knows they came from, for a list whose fields do not tell)."""
    shape = shape_of(messages, api)
    synthetic = {**(extra or {}), "model": model, LIST_FIELD[shape]: messages}
    try:
        body = orjson.dumps(synthetic)
    except orjson.JSONEncodeError as exc:
        raise InvalidRequestError(f"`messages` cannot be read: {exc}.", param="messages") from None
    try:
        return WIRE[shape].parse(body, max_messages)
    except InvalidRequestError as error:
        raise _as_messages(error, LIST_FIELD[shape]) from None


def shape_of(messages: Sequence[Any], default: str | None = None) -> str:
    """Which API `messages` are written in (module docstring); 400 when they mix two;
    `default` (else chat) when no message says."""
    found: dict[str, int] = {}
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(
                f"`messages[{index}]` must be an object.", param=f"messages[{index}]"
            )
        for shape in _marks(message):
            found.setdefault(shape, index)
    if len(found) > 1:
        (first, at), (second, then) = sorted(found.items(), key=lambda kv: kv[1])[:2]
        raise InvalidRequestError(
            f"`messages` mixes shapes: messages[{at}] is written as {_NAMES[first]}, "
            f"messages[{then}] as {_NAMES[second]}; send one API's messages.",
            param=f"messages[{then}]",
        )
    return next(iter(found), default or "chat")


_NAMES = {"chat": "OpenAI chat", "messages": "Anthropic Messages", "responses": "Responses items"}


def _marks(message: Mapping[str, Any]) -> set[str]:
    """The APIs whose fields `message` carries."""
    if "type" in message:  # only Responses items have one (their roles include developer)
        return {"responses"}
    marks: set[str] = set()
    role = message.get("role")
    if (isinstance(role, str) and role in CHAT_ROLES) or any(f in message for f in CHAT_FIELDS):
        marks.add("chat")
    content = message.get("content")
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if not isinstance(kind, str):  # the adapter says what is wrong with it
                continue
            if kind in ANTHROPIC_BLOCKS or "cache_control" in part:
                marks.add("messages")
            elif kind == "image" and "source" in part:
                marks.add("messages")
            elif kind in CHAT_PARTS:
                marks.add("chat")
            elif kind in RESPONSES_PARTS:
                marks.add("responses")
    return marks


def _leading_user(shape: str, system: Any) -> dict[str, Any]:
    """What a step placed in the system prompt, as the conversation's first (user) message."""
    if isinstance(system, str):
        blocks: list[Any] = [{"type": "text", "text": system}]
    else:
        blocks = list(system) if isinstance(system, list) else [system]
    if shape == "responses":
        text = "\n\n".join(b.get("text", "") for b in blocks if isinstance(b, dict))
        part = {"type": "input_text", "text": text}
        return {"type": "message", "role": "user", "content": [part]}
    return {"role": "user", "content": blocks}


def _as_messages(error: InvalidRequestError, field: str) -> InvalidRequestError:
    """An adapter's error about its list field, naming the caller's `messages` instead."""
    if field == "messages" or error.param is None or not error.param.startswith(field):
        return error
    param = "messages" + error.param[len(field) :]
    message = error.message.replace(f"`{field}", "`messages")
    return type(error)(message, param=param, code=error.code)
