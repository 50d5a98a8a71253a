"""The Responses API (`POST /v1/responses`): input items to the canonical conversation and back.

How items map (the policies then keep every pair and group whole, as on chat):

- `instructions` is a system message at the head, never trimmed; a string `input` is one user
  message; `message` items with role user/system/developer are messages of that role.
- Everything the model produced between two non-assistant items is ONE assistant message:
  `reasoning` items, assistant `message` items, calls. A call that expects an answer (any item
  with a `call_id`: `function_call`, `custom_tool_call`, `computer_call`, `local_shell_call`, ...)
  becomes a tool call with that id, so it is kept or dropped together with its output. A
  `reasoning` item therefore always stays with the call or message after it: the provider
  rejects a function call sent without the reasoning item that preceded it.
- Each `*_output` item (and `mcp_approval_response`) is a tool message answering its call.
- A `compaction` item stands for the history before it: a pinned message, never dropped.
- Unknown item types ride along with the message before them (or the first one after them,
  when they lead): kept or dropped with it, never separated from their neighbours.

Rendering puts back the exact items of every canonical message a step did not change;
`encrypted_content` and ids are never touched. A changed message is rendered onto its own
items (a masked output replaces `output`, new text replaces the assistant message's text); a
message a step made becomes a plain `message` item of its role.

The parse is `responses_parse` (items to canonical messages and their `Layout`); this module is
the adapter the gateway calls and the rendering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from policies.conversation import content_text

from ..errors import InvalidRequestError
from .base import Wire, WireRequest, unchanged
from .context_errors import ContextError, classify
from .fields import check_count, check_tools, load_object, read_model, read_positive, read_stream
from .responses_parse import INSTRUCTIONS, Builder, Layout
from .usage import Usage, json_or_none, openai_usage, sse_events

if TYPE_CHECKING:
    from policies import Message

    from ..counting.tokens import MessageCounter
    from .resent import ResentScope

PREAMBLE = frozenset({"response.created", "response.in_progress", "response.queued"})
FINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})


class ResponsesWire(Wire):
    name = "responses"
    upstream_path = "/responses"
    answer_field = "output"
    conversation_field = "input"

    def parse(
        self, body: bytes, max_messages: int, resent: ResentScope | None = None
    ) -> WireRequest:
        payload = resent.load(body, "input") if resent is not None else load_object(body)
        model = read_model(payload)
        stream = read_stream(payload)
        instructions = payload.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidRequestError("`instructions` must be a string.", param="instructions")
        stateful = (
            payload.get("previous_response_id") is not None
            or payload.get("conversation") is not None
        )
        raw = payload.get("input")
        seen = None
        builder = None
        if isinstance(raw, list) and resent is not None:
            check_count(len(raw), max_messages, "input")
            seen = resent.seen({"responses": instructions}, raw)
            if seen is not None and isinstance(seen.state, Builder):
                builder = Builder.resumed(seen.state, seen.same, stateful)
        if builder is None:
            builder = Builder(stateful)
            if isinstance(instructions, str):
                builder.instructions(instructions)
        if isinstance(raw, str):
            builder.item({"type": "message", "role": "user", "content": raw}, 0, None)
            string_input = True
        elif isinstance(raw, list):
            check_count(len(raw), max_messages, "input")
            for index in range(len(builder.items), len(raw)):
                builder.item(raw[index], index, f"input[{index}]")
            string_input = False
        elif raw is None:
            string_input = False
        else:
            raise InvalidRequestError(
                "`input` must be a string or an array of items.", param="input"
            )
        builder.finish()
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
            marks=builder.marks,
            has_extension=builder.has_extension,
            max_output=read_positive(payload, "max_output_tokens"),
            layout=Layout(builder.items, builder.spans, string_input),
            stateful=stateful,
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
            out: list[Any] = []
            for message, same in zip(
                messages, unchanged(messages, request.messages, uids), strict=True
            ):
                origin = message.origin
                if origin < 0:
                    out.append(_new_item(message.data))
                    continue
                span = layout.spans[origin]
                if span == (INSTRUCTIONS,):
                    if not same:
                        payload["instructions"] = content_text(message.data.get("content"))
                    continue
                items = [layout.items[i] for i in span]
                out.extend(items if same else _changed(message.data, items))
            payload["input"] = out
        elif request.has_extension:
            payload["input"] = layout.items
        if model is not None:
            payload["model"] = model
        return payload

    def max_output_field(self, payload: Mapping[str, Any]) -> str:
        return "max_output_tokens"

    def tools_tokens(self, request: WireRequest, counter: MessageCounter) -> int:
        tools = request.payload.get("tools")
        if not tools:
            return 0
        instructions = request.payload.get("instructions")
        return counter.tools(
            [_chat_tool(t) for t in tools],
            system_text=instructions if isinstance(instructions, str) else None,
            source=tools,
        )

    # -- errors and usage --------------------------------------------------------------------

    def stream_error_event(self, error: Any, sequence: int = 0) -> bytes:
        event = {
            "type": "error",
            "code": error.code,
            "message": error.message,
            "param": error.param,
            "sequence_number": sequence,
        }
        return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"

    def final_event(self, name: bytes, data: bytes, document: Any) -> bool:
        kind = document.get("type") if isinstance(document, dict) else None
        return (kind or name.decode("latin-1")) in FINAL

    def head_decided(self, head: bytes) -> bool:
        """Read past the preamble (`response.created`, `response.in_progress`): a failure
        event may follow it."""
        for name, data in sse_events(head):
            document = json_or_none(data)
            kind = document.get("type") if isinstance(document, dict) else None
            if (kind or name.decode("latin-1")) not in PREAMBLE:
                return True
        return False

    def stream_context_error(self, first: bytes) -> ContextError | None:
        if not first:
            return ContextError(signature="empty_stream", limit=None, requested=None)
        for name, data in sse_events(first):
            document = json_or_none(data)
            if not isinstance(document, dict):
                continue
            kind = document.get("type") or name.decode("latin-1")
            if kind == "error" or ("error" in document and kind != "response.failed"):
                error = document.get("error", document)
                return _classified(error)
            if kind == "response.failed":
                response = document.get("response")
                error = response.get("error") if isinstance(response, dict) else None
                return _classified(error) if isinstance(error, dict) else None
            if kind not in PREAMBLE:
                return None
        return None

    def usage_of(self, document: Mapping[str, Any]) -> Usage | None:
        response = document.get("response")
        if isinstance(response, dict):  # a stream event carrying the response object
            document = response
        return openai_usage(document.get("usage"), "input_tokens", "output_tokens")

    def plain_request(
        self, model: str, system: str, prompt: str, limit: int | None, limit_field: str
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": model,
            "instructions": system,
            "input": prompt,
            "stream": False,
            "store": False,
        }
        if limit is not None:
            payload["max_output_tokens"] = limit
        return payload

    def answer_text(self, document: Mapping[str, Any]) -> str | None:
        output = document.get("output")
        if not isinstance(output, list):
            return None
        texts = [
            part["text"]
            for item in output
            if isinstance(item, dict) and item.get("type") == "message"
            for part in item.get("content") or ()
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "".join(texts)

    def stream_usage(self, name: bytes, data: bytes, known: Usage | None) -> Usage | None:
        if not name.startswith(b"response.") or b'"usage"' not in data:
            return None
        return super().stream_usage(name, data, known)


def _classified(error: Mapping[str, Any]) -> ContextError | None:
    """An error object of a Responses stream, judged as the same error in a 400 body would be.
    A context error may come with an empty message: its code says it all."""
    envelope = {
        "error": {
            "message": error.get("message") or "",
            "type": error.get("type") or "invalid_request_error",
            "code": error.get("code"),
            "param": error.get("param"),
        }
    }
    return classify(400, orjson.dumps(envelope))


def _wire_part(part: Any, text_type: str) -> Any:
    """A canonical part back in this API's shape: its original when it has one."""
    if not isinstance(part, dict):
        return part
    source = part.get("source")
    if part.get("type") == "text":
        if isinstance(source, dict) and source.get("text") == part.get("text"):
            return source
        base = source if isinstance(source, dict) else {"type": text_type}
        return {**base, "text": part.get("text", "")}
    return source if isinstance(source, dict) else part


def _wire_content(content: Any, text_type: str) -> Any:
    if isinstance(content, list):
        return [_wire_part(part, text_type) for part in content]
    return content if content is not None else ""


def _changed(data: Mapping[str, Any], items: list[Any]) -> list[Any]:
    """The items of one canonical message a step changed, with the change written onto them."""
    role = data.get("role")
    if role == "tool":
        out = []
        for item in items:
            if isinstance(item, dict) and "call_id" in item and "output" in item:
                item = {**item, "output": _wire_content(data.get("content"), "input_text")}
            out.append(item)
        return out
    if role == "assistant":
        return _changed_turn(data, items)
    if data.get("compacted") is not None or not items:
        return items
    first = items[0]
    content = data.get("content")
    if isinstance(first.get("content"), str) and not isinstance(content, list):
        rendered: Any = content_text(content)
    else:
        rendered = _wire_content(content, "input_text")
    return [{**first, "content": rendered}, *items[1:]]


def _changed_turn(data: Mapping[str, Any], items: list[Any]) -> list[Any]:
    text = content_text(data.get("content"))
    calls = data.get("tool_calls")
    keep_calls = None if calls is None else {c.get("id") for c in calls if isinstance(c, dict)}
    out: list[Any] = []
    written = False
    for item in items:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            if written or not text:
                continue
            parts = item.get("content")
            first = parts[0] if isinstance(parts, list) and parts else {"type": "output_text"}
            if isinstance(parts, str):
                item = {**item, "content": text}
            else:
                item = {**item, "content": [{**first, "text": text}]}
            written = True
        elif isinstance(item, dict) and "call_id" in item and keep_calls is not None:
            if item["call_id"] not in keep_calls:
                continue
        out.append(item)
    if text and not written:
        out.append({"type": "message", "role": "assistant", "content": [_output_text(text)]})
    return out


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _new_item(data: Mapping[str, Any]) -> dict[str, Any]:
    """A message a step made (a summary, a placeholder) as an input item."""
    role = data.get("role", "user")
    if role == "tool":  # never made by a step; kept readable if one ever is
        role = "user"
    content = data.get("content")
    if role == "assistant":
        return {
            "type": "message",
            "role": "assistant",
            "content": [_output_text(content_text(content))],
        }
    return {
        "type": "message",
        "role": role,
        "content": _wire_content(content, "input_text")
        if isinstance(content, list)
        else content_text(content),
    }


def _chat_tool(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Responses tool definition in the chat shape the counter renders."""
    if tool.get("type") != "function":
        return tool
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


RESPONSES = ResponsesWire()
