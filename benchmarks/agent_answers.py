"""The fast upstream's answers in the two agent APIs, prepared once as HTTP response bytes.

The Responses API (`POST /v1/responses`, what Codex CLI speaks) and Anthropic Messages
(`POST /v1/messages`, what Claude Code speaks) each get a short assistant answer with a usage
block: a JSON body, or, when streamed, the API's own SSE event sequence (`event:` + `data:`
lines; Responses events carry an increasing `sequence_number` and end with `response.completed`,
no `[DONE]`; Messages run `message_start` ... `message_stop`, with a `ping` and the usage in
`message_delta`). The peers under test parse these with their real code paths, so the shapes are
the real ones; the content never changes, so answering costs the upstream almost nothing.
"""

from __future__ import annotations

from typing import Any

import orjson

JSON = dict[str, Any]
MODEL = "bench-upstream"
TEXT_PIECES = 18  # content deltas per streamed answer, as the chat stream sends


def _words(count: int) -> list[str]:
    return [f" word{i}" for i in range(1, count + 1)]


def responses_body() -> JSON:
    text = "".join(_words(TEXT_PIECES))
    return {
        "id": "resp_bench000000000000000000000000",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": MODEL,
        "output": [
            {
                "type": "message",
                "id": "msg_bench000000000000000000000000",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 30,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": TEXT_PIECES,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 30 + TEXT_PIECES,
        },
    }


def responses_events() -> list[bytes]:
    """The SSE frames of `responses_body()`, streamed as the Responses API does."""
    body = responses_body()
    item = body["output"][0]
    shell = {**body, "status": "in_progress", "output": [], "usage": None}
    where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    empty_part = {"type": "output_text", "text": "", "annotations": []}
    events: list[JSON] = [
        {"type": "response.created", "response": shell},
        {"type": "response.in_progress", "response": shell},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **where, "part": empty_part},
    ]
    events += [
        {"type": "response.output_text.delta", **where, "delta": piece}
        for piece in _words(TEXT_PIECES)
    ]
    text = item["content"][0]["text"]
    events += [
        {"type": "response.output_text.done", **where, "text": text},
        {"type": "response.content_part.done", **where, "part": item["content"][0]},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": body},
    ]
    return [
        _frame(event["type"], {"type": event["type"], "sequence_number": number, **event})
        for number, event in enumerate(events)
    ]


def messages_body() -> JSON:
    return {
        "id": "msg_bench000000000000000000000000",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": "".join(_words(TEXT_PIECES))}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 30,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": TEXT_PIECES,
        },
    }


def messages_events() -> list[bytes]:
    """The SSE frames of `messages_body()`, streamed as Anthropic's Messages API does."""
    body = messages_body()
    start = {**body, "content": [], "stop_reason": None, "usage": {**body["usage"]}}
    start["usage"]["output_tokens"] = 1
    frames = [
        _frame("message_start", {"type": "message_start", "message": start}),
        _frame(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        _frame("ping", {"type": "ping"}),
    ]
    frames += [
        _frame(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            },
        )
        for piece in _words(TEXT_PIECES)
    ]
    frames += [
        _frame("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _frame(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": TEXT_PIECES},
            },
        ),
        _frame("message_stop", {"type": "message_stop"}),
    ]
    return frames


def _frame(name: str, data: JSON) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


# What a streamed answer of each API ends with: the load generator counts a stream without it
# as an error (a stream cut short), as it does a chat stream without `data: [DONE]`.
STREAM_END = {
    "chat": b"data: [DONE]",
    "responses": b"response.completed",
    "messages": b"message_stop",
}
