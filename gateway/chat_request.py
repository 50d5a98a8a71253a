"""Parsing and validating a chat-completions body (R6.1) before anything goes upstream.

The body is parsed once with orjson; we check only what the gateway relies on (model, messages,
roles, content types, tool calls, the numbers we read) and leave every other field alone, so
unknown fields pass through (R1.1). Each problem is an `InvalidRequestError` naming its `param`
(`messages[3].role`). Our message extension `"compactgate": {...}` is read into marks and
stripped; the original bytes are kept so an unchanged request is forwarded byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from .errors import InvalidRequestError

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
KINDS = frozenset({"message", "code", "plan_ref", "log", "other"})
EXTENSION = "compactgate"


@dataclass(frozen=True, slots=True)
class Marks:
    pin: bool = False
    priority: int | None = None
    kind: str | None = None


NO_MARKS = Marks()


@dataclass(frozen=True, slots=True)
class ChatRequest:
    body: bytes  # exactly as received
    payload: dict[str, Any]  # parsed body; `messages` still as sent
    model: str
    stream: bool
    messages: list[dict[str, Any]]  # with our extension stripped
    marks: list[Marks]
    has_extension: bool
    max_output: int | None  # max_completion_tokens or max_tokens
    include_usage: bool  # stream_options.include_usage

    def with_max_output(self, value: int) -> ChatRequest:
        """The same request asking for at most `value` output tokens (clamp_max_tokens)."""
        key = "max_completion_tokens" if "max_completion_tokens" in self.payload else "max_tokens"
        payload = {**self.payload, key: value}
        return replace(self, payload=payload, body=orjson.dumps(payload), max_output=value)

    def forward_payload(
        self, messages: list[Any] | None, model: str | None, inject_usage: bool = False
    ) -> dict[str, Any]:
        """The payload to forward: the client's, with new messages/model when given."""
        payload = dict(self.payload)
        if inject_usage:
            options = self.payload.get("stream_options")
            payload["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        if messages is not None:
            payload["messages"] = messages
        elif self.has_extension:
            payload["messages"] = self.messages
        if model is not None:
            payload["model"] = model
        return payload


def parse_chat_request(body: bytes, max_messages: int) -> ChatRequest:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError(
            "`model` is required and must be a non-empty string.", param="model"
        )
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequestError("`stream` must be a boolean.", param="stream")
    raw_messages = payload.get("messages")
    if not isinstance(raw_messages, list):
        raise InvalidRequestError("`messages` is required and must be an array.", param="messages")
    if not raw_messages:
        raise InvalidRequestError("`messages` must contain at least one message.", param="messages")
    if len(raw_messages) > max_messages:
        raise InvalidRequestError(
            f"`messages` has {len(raw_messages)} messages; "
            f"this gateway accepts at most {max_messages}.",
            param="messages",
        )
    messages: list[dict[str, Any]] = []
    marks: list[Marks] = []
    has_extension = False
    for index, message in enumerate(raw_messages):
        _check_message(message, index)
        if EXTENSION in message:
            has_extension = True
            marks.append(_marks(message[EXTENSION], index))
            message = {k: v for k, v in message.items() if k != EXTENSION}
        else:
            marks.append(NO_MARKS)
        messages.append(message)
    max_output = _max_output(payload)
    _check_tools(payload)
    options = payload.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return ChatRequest(
        body=body,
        payload=payload,
        model=model,
        stream=stream,
        messages=messages,
        marks=marks,
        has_extension=has_extension,
        max_output=max_output,
        include_usage=include_usage,
    )


def _check_message(message: Any, index: int) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise InvalidRequestError(f"{where} must be an object.", param=where)
    role = message.get("role")
    if not isinstance(role, str):
        raise InvalidRequestError(
            f"{where}.role is required and must be a string.", param=f"{where}.role"
        )
    if role not in ROLES:
        raise InvalidRequestError(
            f"{where}.role {role!r} is not one of {', '.join(sorted(ROLES))}.",
            param=f"{where}.role",
        )
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise InvalidRequestError(
            f"{where}.content must be a string, an array of content parts or null.",
            param=f"{where}.content",
        )
    if isinstance(content, list):
        for part_index, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise InvalidRequestError(
                    f"{where}.content[{part_index}] must be an object with a string `type`.",
                    param=f"{where}.content[{part_index}]",
                )
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise InvalidRequestError(
                    f"{where}.content[{part_index}].text must be a string.",
                    param=f"{where}.content[{part_index}].text",
                )
    if role in ("user", "system", "developer") and content is None:
        raise InvalidRequestError(
            f"{where}.content is required for role {role}.", param=f"{where}.content"
        )
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidRequestError(f"{where}.name must be a string.", param=f"{where}.name")
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise InvalidRequestError(
            f"{where}.tool_call_id is required for tool messages and must be a string.",
            param=f"{where}.tool_call_id",
        )
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant" or not isinstance(tool_calls, list):
            raise InvalidRequestError(
                f"{where}.tool_calls must be an array on an assistant message.",
                param=f"{where}.tool_calls",
            )
        for call_index, call in enumerate(tool_calls):
            _check_tool_call(call, f"{where}.tool_calls[{call_index}]")


def _check_tool_call(call: Any, where: str) -> None:
    if not isinstance(call, dict) or not isinstance(call.get("id"), str):
        raise InvalidRequestError(f"{where} must be an object with a string `id`.", param=where)
    function = call.get("function")
    if function is not None:
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequestError(
                f"{where}.function.name must be a string.", param=f"{where}.function"
            )
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            raise InvalidRequestError(
                f"{where}.function.arguments must be a string.", param=f"{where}.function.arguments"
            )


def _check_tools(payload: Mapping[str, Any]) -> None:
    for key in ("tools", "functions"):
        value = payload.get(key)
        if value is not None and not (
            isinstance(value, list) and all(isinstance(t, dict) for t in value)
        ):
            raise InvalidRequestError(f"`{key}` must be an array of objects.", param=key)


def _max_output(payload: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequestError(f"`{key}` must be a positive integer.", param=key)
        return value
    return None


def _marks(value: Any, index: int) -> Marks:
    where = f"messages[{index}].{EXTENSION}"
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{where} must be an object.", param=where)
    unknown = set(value) - {"pin", "priority", "type"}
    if unknown:
        raise InvalidRequestError(
            f"{where} has unknown keys: {', '.join(sorted(unknown))}.", param=where
        )
    pin = value.get("pin", False)
    if not isinstance(pin, bool):
        raise InvalidRequestError(f"{where}.pin must be a boolean.", param=f"{where}.pin")
    priority = value.get("priority")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 3
    ):
        raise InvalidRequestError(f"{where}.priority must be 1, 2 or 3.", param=f"{where}.priority")
    kind = value.get("type")
    if kind is not None and (not isinstance(kind, str) or kind not in KINDS):
        raise InvalidRequestError(
            f"{where}.type must be one of {', '.join(sorted(KINDS))}.", param=f"{where}.type"
        )
    return Marks(pin=pin, priority=priority, kind=kind)
