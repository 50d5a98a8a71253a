"""Chat Completions (`POST /v1/chat/completions`): the canonical form is this API's own.

The body is parsed once with orjson; only what the gateway relies on is checked (model,
messages, roles, content types, tool calls, the numbers it reads) and every other field is left
alone, so unknown fields pass through. Each problem is a 400 naming its `param`
(`messages[3].role`). The messages are the canonical conversation as they are, so rendering is
putting the compacted list back into the payload.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from policies.conversation import content_text

from ..errors import InvalidRequestError
from .base import Wire, WireRequest
from .fields import (
    EXTENSION,
    NO_MARKS,
    Marks,
    check_tools,
    load_object,
    read_marks,
    read_model,
    read_positive,
    read_stream,
)
from .usage import Usage, openai_usage
from .validated import ValidatedMessages

if TYPE_CHECKING:
    from policies import Message

    from ..counting.tokens import MessageCounter
    from .resent import ResentScope

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class ChatWire(Wire):
    name = "chat"
    upstream_path = "/chat/completions"
    asks_stream_usage = True
    answer_field = "choices"

    def __init__(self, validated: ValidatedMessages | None = None) -> None:
        self._validated = validated  # a resent history's messages are not checked again

    def parse(
        self, body: bytes, max_messages: int, resent: ResentScope | None = None
    ) -> WireRequest:
        """The body as a request; given the caller's `resent` view, messages equal to those of
        the caller's previous valid request of the conversation are not checked again."""
        scope = resent.tenant if resent is not None else None
        payload = resent.load(body, "messages") if resent is not None else load_object(body)
        model = read_model(payload)
        stream = read_stream(payload)
        raw_messages = payload.get("messages")
        if not isinstance(raw_messages, list):
            raise InvalidRequestError(
                "`messages` is required and must be an array.", param="messages"
            )
        if not raw_messages:
            raise InvalidRequestError(
                "`messages` must contain at least one message.", param="messages"
            )
        if len(raw_messages) > max_messages:
            raise InvalidRequestError(
                f"`messages` has {len(raw_messages)} messages; "
                f"this gateway accepts at most {max_messages}.",
                param="messages",
            )
        validated = self._validated if scope is not None else None
        known = validated.known(scope or "", raw_messages) if validated is not None else None
        checked_from = known.count if known is not None else 0
        try:  # only the messages not known valid are looked at
            for index in range(checked_from, len(raw_messages)):
                _check_message(raw_messages[index], index)
        except InvalidRequestError:
            _read_messages(raw_messages, checked_from)  # the first problem in the body's order
            raise
        # Messages equal to a remembered request none of whose messages carried it: not looked at.
        unmarked = checked_from if known is not None and not known.marked else 0
        fresh = itertools.islice(raw_messages, unmarked, None)
        has_extension = any(map(operator.contains, fresh, itertools.repeat(EXTENSION)))
        if has_extension:
            messages, marks = _read_messages(raw_messages, len(raw_messages))
        else:  # nothing to read or strip
            messages, marks = list(raw_messages), [NO_MARKS] * len(raw_messages)
        max_output = read_positive(payload, "max_completion_tokens", "max_tokens")
        check_tools(payload, "tools", "functions")
        options = payload.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        if validated is not None and known is not None:
            validated.remember(known, raw_messages, len(body), has_extension)
        return WireRequest(
            wire=self,
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

    def render(
        self,
        request: WireRequest,
        messages: Sequence[Message] | None,
        model: str | None,
        inject_usage: bool,
        uids: Sequence[int | None] = (),
    ) -> dict[str, Any]:
        payload = dict(request.payload)
        if inject_usage:
            options = request.payload.get("stream_options")
            payload["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        if messages is not None:
            payload["messages"] = [m.data for m in messages]
        elif request.has_extension:
            payload["messages"] = request.messages
        if model is not None:
            payload["model"] = model
        return payload

    def final_event(self, name: bytes, data: bytes, document: Any) -> bool:
        """`[DONE]`, or an error (after which OpenAI ends the stream)."""
        return data == b"[DONE]" or (isinstance(document, dict) and "error" in document)

    def max_output_field(self, payload: Mapping[str, Any]) -> str:
        return "max_completion_tokens" if "max_completion_tokens" in payload else "max_tokens"

    def tools_tokens(self, request: WireRequest, counter: MessageCounter) -> int:
        return counter.tools(
            request.payload.get("tools"),
            request.payload.get("functions"),
            system_text=_system_text(request.messages),
        )

    def usage_of(self, document: Mapping[str, Any]) -> Usage | None:
        return openai_usage(document.get("usage"), "prompt_tokens", "completion_tokens")

    def plain_request(
        self, model: str, system: str, prompt: str, limit: int | None, limit_field: str
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": prompt},
            ],
            "stream": False,
        }
        if limit is not None:
            payload[limit_field] = limit
        return payload

    def answer_text(self, document: Mapping[str, Any]) -> str | None:
        choices = document.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        message = choices[0].get("message")
        return content_text(message.get("content")) if isinstance(message, dict) else None


def _read_messages(raw: list[Any], checked_from: int) -> tuple[list[dict[str, Any]], list[Marks]]:
    """The messages with our extension read into marks and stripped, each checked in order
    from `checked_from` (so the first problem in the body is the one reported)."""
    messages: list[dict[str, Any]] = []
    marks: list[Marks] = []
    for index, message in enumerate(raw):
        if index >= checked_from:
            _check_message(message, index)
        if EXTENSION in message:
            marks.append(read_marks(message[EXTENSION], f"messages[{index}]"))
            message = {k: v for k, v in message.items() if k != EXTENSION}
        else:
            marks.append(NO_MARKS)
        messages.append(message)
    return messages, marks


def _system_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The first system message's text: tool definitions are rendered into it upstream."""
    for message in messages:
        if message.get("role") == "system":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


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


CHAT = ChatWire()


def parse_chat_request(body: bytes, max_messages: int) -> WireRequest:
    """A chat-completions body as a `WireRequest` (400 on anything the gateway cannot use)."""
    return CHAT.parse(body, max_messages)
