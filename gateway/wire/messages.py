"""Anthropic Messages (`POST /v1/messages`): messages and content blocks to the canonical
conversation and back.

How blocks map (the policies then keep every pair whole, as on chat):

- The top-level `system` (a string or text blocks) is the head, never trimmed; a `role: "system"`
  entry inside `messages` is a protected system message where it stands.
- A user message's `tool_result` blocks each become a tool message answering its `tool_use_id`;
  its other blocks (text, images, documents, unknown ones) one user message after them, which
  is where a Turn starts. A user message of tool results only starts no Turn.
- An assistant message is one assistant message: `tool_use` blocks are its tool calls (so each
  stays with its result in the next user message), `thinking` text is counted, and
  `redacted_thinking`, server-tool and unknown blocks ride along unchanged.
- The latest assistant message is pinned: its thinking blocks and signatures must go back
  exactly as they came whenever tools are in use.
- A message holding a `compaction` block stands for the history before it: pinned.

Rendering groups canonical messages back into the message they came from. A message whose
canonical parts all survived unchanged is forwarded exactly as it was sent; otherwise it is
rebuilt from its kept blocks (changed ones rewritten: a masked result's `content`, new text in
place of the old text blocks; `thinking` blocks and their `signature` are never rewritten).
A message a step made is a new user or assistant message, or, for the system role, a text
block appended to `system`. Prompt-cache breakpoints: when a block that carried `cache_control`
is removed, its marker moves to the nearest kept block before it, never past a longer-lived
marker, and there are never more than four.

An agent resends its history every turn: a parse resumes the conversation's previous one after
the messages resent byte for byte (`resent`), and a rewritten message is reused while it would be
made from the very same objects again (`Layout.renders`).

The parse is `messages_parse` (blocks to canonical messages and their `Layout`), the rendering
`messages_render`; this module is the adapter the gateway calls, with Anthropic's errors and usage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import GatewayError, InvalidRequestError
from .base import Wire, WireRequest
from .fields import check_count, check_tools, load_object, read_model, read_positive, read_stream
from .messages_parse import Builder, Layout
from .messages_render import Renderer
from .usage import Usage, json_or_none, number, sse_events

if TYPE_CHECKING:
    from policies import Message

    from ..counting.tokens import MessageCounter
    from .context_errors import ContextError
    from .resent import ResentScope

DEFAULT_MAX_TOKENS = 4096  # the gateway's own calls, when no limit is configured
# Anthropic's error `type` for each status the gateway itself answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class MessagesWire(Wire):
    name = "messages"
    upstream_path = "/messages"
    answer_field = "content"

    def __init__(self, *, count_only: bool = False) -> None:
        self.count_only = count_only  # /v1/messages/count_tokens: no max_tokens, no stream

    def parse(
        self, body: bytes, max_messages: int, resent: ResentScope | None = None
    ) -> WireRequest:
        payload = resent.load(body, "messages") if resent is not None else load_object(body)
        model = read_model(payload)
        stream = False if self.count_only else read_stream(payload)
        max_output = read_positive(payload, "max_tokens")
        if max_output is None and not self.count_only:
            raise InvalidRequestError("max_tokens: Field required", param="max_tokens")
        raw = payload.get("messages")
        if not isinstance(raw, list):
            raise InvalidRequestError("messages: Field required", param="messages")
        check_count(len(raw), max_messages, "messages")
        system = payload.get("system")
        seen = None if resent is None else resent.seen(system, raw)
        if seen is not None and isinstance(seen.state, Builder):  # (a Messages parse)
            builder = Builder.resumed(seen.state, seen.same)
        else:
            builder = Builder()
            builder.system(system)
        for index in range(len(builder.wire_messages), len(raw)):
            builder.message(raw[index], index)
        marks = builder.finish()
        check_tools(payload, "tools")
        if seen is not None and resent is not None:
            resent.keep(seen, builder)
        return WireRequest(
            wire=self,
            body=body,
            payload=payload,
            model=model,
            stream=stream,
            messages=builder.messages,
            marks=marks,
            has_extension=builder.has_extension,
            max_output=max_output,
            layout=Layout(
                builder.wire_messages,
                builder.spans,
                builder.parts,
                builder.marked,
                bool(builder.marked) or builder.nested_markers,
                builder.renders,
            ),
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
        layout: Layout = request.layout
        if messages is not None:
            Renderer(request, layout, payload).render(messages, uids)
        elif request.has_extension:
            payload["messages"] = layout.messages
        if model is not None:
            payload["model"] = model
        return payload

    def max_output_field(self, payload: Mapping[str, Any]) -> str:
        return "max_tokens"

    def tools_tokens(self, request: WireRequest, counter: MessageCounter) -> int:
        tools = request.payload.get("tools")
        if not tools:
            return 0
        return counter.tools(
            [_chat_tool(t) for t in tools],
            system_text=_system_text(request.payload.get("system")),
            source=tools,
        )

    # -- errors ------------------------------------------------------------------------------

    def error_body(self, error: GatewayError) -> bytes:
        return orjson.dumps(_error(error))

    def final_event(self, name: bytes, data: bytes, document: Any) -> bool:
        kind = document.get("type") if isinstance(document, dict) else None
        return (kind or name.decode("latin-1")) in ("message_stop", "error")

    def stream_error_event(self, error: GatewayError, sequence: int = 0) -> bytes:
        return b"event: error\ndata: " + orjson.dumps(_error(error)) + b"\n\n"

    def stream_context_error(self, first: bytes) -> ContextError | None:
        if not first:
            return None  # Anthropic-shaped servers do not answer an overflow with an empty 200
        return super().stream_context_error(first)

    def head_decided(self, head: bytes) -> bool:
        """Read past `message_start` and `ping`: an error event may follow them."""
        for name, _ in sse_events(head):
            if name not in (b"message_start", b"ping"):
                return True
        return False

    # -- usage -------------------------------------------------------------------------------

    def usage_of(self, document: Mapping[str, Any]) -> Usage | None:
        message = document.get("message")
        if isinstance(message, dict):  # message_start carries the message object
            document = message
        usage = document.get("usage")
        if not isinstance(usage, dict):
            return None
        return _usage(usage, None)

    def stream_usage(self, name: bytes, data: bytes, known: Usage | None) -> Usage | None:
        if name not in (b"message_start", b"message_delta"):
            return None
        document = json_or_none(data)
        if not isinstance(document, dict):
            return None
        if name == b"message_start":
            return self.usage_of(document)
        usage = document.get("usage")  # cumulative: output so far, input fields when restated
        return _usage(usage, known) if isinstance(usage, dict) else None

    def credential_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key}

    def plain_request(
        self, model: str, system: str, prompt: str, limit: int | None, limit_field: str
    ) -> dict[str, Any]:
        return {
            "model": model,
            "system": system,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": limit or DEFAULT_MAX_TOKENS,  # required by the API
            "stream": False,
        }

    def answer_text(self, document: Mapping[str, Any]) -> str | None:
        content = document.get("content")
        if not isinstance(content, list):
            return None
        return "".join(
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )


def _error(error: GatewayError) -> dict[str, Any]:
    fallback = "api_error" if error.status >= 500 else "invalid_request_error"
    kind = ERROR_TYPES.get(error.status, fallback)
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _usage(usage: Mapping[str, Any], known: Usage | None) -> Usage:
    """Anthropic usage in our convention: `input_tokens` is only the uncached remainder."""
    if known is not None and "input_tokens" not in usage:
        return Usage(
            input=known.input,
            output=number(usage.get("output_tokens")) or known.output,
            cache_read=known.cache_read,
            cache_write_5m=known.cache_write_5m,
            cache_write_1h=known.cache_write_1h,
        )
    read = number(usage.get("cache_read_input_tokens"))
    written = number(usage.get("cache_creation_input_tokens"))
    split = usage.get("cache_creation")
    if isinstance(split, dict):
        hour = number(split.get("ephemeral_1h_input_tokens"))
        five = number(split.get("ephemeral_5m_input_tokens"))
        if hour + five != written:  # trust the total; the remainder is the default 5 minutes
            five = max(0, written - hour)
    else:
        hour, five = 0, written
    return Usage(
        input=number(usage.get("input_tokens")) + read + written,
        output=number(usage.get("output_tokens")),
        cache_read=read,
        cache_write_5m=five,
        cache_write_1h=hour,
    )


def _system_text(system: Any) -> str | None:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        texts = [b.get("text") for b in system if isinstance(b, dict)]
        return "\n".join(t for t in texts if isinstance(t, str))
    return None


def _chat_tool(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """An Anthropic tool definition in the chat shape the counter renders."""
    if "input_schema" not in tool:
        return tool  # a server tool (web search, code execution...): counted as its JSON
    function = {"name": tool.get("name", ""), "parameters": tool["input_schema"]}
    if "description" in tool:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


MESSAGES = MessagesWire()
COUNT_TOKENS = MessagesWire(count_only=True)
