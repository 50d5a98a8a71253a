"""An answer the gateway gives itself, in each API's own shape: a JSON body or an SSE stream.

Used when the gateway answers a request without the upstream (an agent's compaction request
answered from a summary made ahead of need, a Responses `compaction_trigger` the gateway
compacts itself): the client's SDK must not be able to tell it from a model's answer. One
assistant text (or one compaction item), its usage, and the events each API streams for it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson

from .usage import Usage


def answer(api: str, text: str, model: str, usage: Usage, stream: bool) -> tuple[bytes, bytes]:
    """(content type, body) of an answer carrying `text`."""
    if not stream:
        body = {"chat": _chat, "responses": _responses, "messages": _messages}[api](
            text, model, usage
        )
        return b"application/json", orjson.dumps(body)
    events = {"chat": _chat_events, "responses": _responses_events, "messages": _messages_events}
    return b"text/event-stream", b"".join(events[api](text, model, usage))


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _chat(text: str, model: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": _id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage.input,
            "completion_tokens": usage.output,
            "total_tokens": usage.input + usage.output,
        },
    }


def _chat_events(text: str, model: str, usage: Usage) -> Iterator[bytes]:
    body = _chat(text, model, usage)
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    deltas = [{"role": "assistant", "content": ""}, {"content": text}]
    for delta in deltas:
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    end = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    yield b"data: " + orjson.dumps({**end, "usage": body["usage"]}) + b"\n\n"
    yield b"data: [DONE]\n\n"


def _responses(text: str, model: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": _id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": [
            {
                "type": "message",
                "id": _id("msg_"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": usage.input,
            "input_tokens_details": {"cached_tokens": usage.cache_read},
            "output_tokens": usage.output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input + usage.output,
        },
    }


def _responses_events(text: str, model: str, usage: Usage) -> Iterator[bytes]:
    body = _responses(text, model, usage)
    item = body["output"][0]
    shell = {**body, "status": "in_progress", "output": [], "usage": None}
    where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": "", "annotations": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": shell},
        {"type": "response.in_progress", "response": shell},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **where, "part": part},
        {"type": "response.output_text.delta", **where, "delta": text},
        {"type": "response.output_text.done", **where, "text": text},
        {"type": "response.content_part.done", **where, "part": {**part, "text": text}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": body},
    ]
    for number, event in enumerate(events):
        data = orjson.dumps({**event, "sequence_number": number})
        yield b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n"


def _messages(text: str, model: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.input - usage.cache_read,
            "cache_read_input_tokens": usage.cache_read,
            "cache_creation_input_tokens": 0,
            "output_tokens": usage.output,
        },
    }


def _messages_events(text: str, model: str, usage: Usage) -> Iterator[bytes]:
    body = _messages(text, model, usage)
    start = {
        **body,
        "content": [],
        "stop_reason": None,
        "usage": {**body["usage"], "output_tokens": 0},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": body["usage"],
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    for name, data in events:
        yield b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def compaction(item: dict[str, Any], model: str, stream: bool) -> tuple[bytes, bytes]:
    """(content type, body) of a Responses answer to a `compaction_trigger`: exactly one
    `compaction` item, nothing billed. Streamed, a compaction item has no deltas: it is added,
    then done."""
    body = _responses("", model, Usage(0))
    body["output"] = [item]
    if not stream:
        return b"application/json", orjson.dumps(body)
    shell = {**body, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": shell},
        {"type": "response.in_progress", "response": shell},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": body},
    ]
    frames = (
        b"event: "
        + event["type"].encode()
        + b"\ndata: "
        + orjson.dumps({**event, "sequence_number": number})
        + b"\n\n"
        for number, event in enumerate(events)
    )
    return b"text/event-stream", b"".join(frames)
