"""A DEMO STAND-IN upstream: a tiny OpenAI-wire-compatible "model" called compactgate-echo.

`compactgate demo` runs the real gateway against this, so a newcomer sees compaction work offline
and without an API key. It is not a language model: it answers "echo: <the latest user message>"
and says how many messages it saw. What it does faithfully is the wire format and the one thing
the demo is about, the context window: it estimates the prompt (characters / 4 over the JSON of
`messages` and `tools`) and, when prompt + `max_tokens` exceeds its window, it refuses exactly as
OpenAI does (400, `context_length_exceeded`), which `gateway.wire.context_errors` recognises.

Every response names itself: `model` is "compactgate-echo" and `system_fingerprint` is
"fp_compactgate_echo_demo". The pure helpers (estimate, bodies, SSE frames) are reused by the test
suite's fake upstream.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from ..upstream.in_process import ServerFactory

MODEL = "compactgate-echo"
FINGERPRINT = "fp_compactgate_echo_demo"


def estimate_prompt_tokens(request: Mapping[str, Any], chars_per_token: float = 4.0) -> int:
    """Characters of the JSON of messages and tools, divided by `chars_per_token`, rounded up."""
    payload = orjson.dumps([request.get("messages") or [], request.get("tools") or []])
    return math.ceil(len(payload.decode()) / chars_per_token)


def latest_user_text(messages: Sequence[Any]) -> str:
    """The text of the last user message (text parts joined), or "" if there is none."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                parts = [p.get("text") for p in content if isinstance(p, dict)]
                return " ".join(p for p in parts if isinstance(p, str))
    return ""


def context_error_body(window: int, prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
    """OpenAI's context-overflow body; the second wording when only max_tokens tips it over."""
    if prompt_tokens > window or not max_tokens:
        message = (
            f"This model's maximum context length is {window} tokens. However, your messages "
            f"resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
        )
    else:
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} "
            "in the completion). Please reduce the length of the messages or completion."
        )
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def completion_body(
    *,
    content: str | None,
    prompt_tokens: int,
    model: str = MODEL,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    completion_tokens: int | None = None,
    fingerprint: str = FINGERPRINT,
) -> dict[str, Any]:
    """A non-streaming chat.completion with a real usage block."""
    if completion_tokens is None:
        size = len(content or "") + len(orjson.dumps(tool_calls or []))
        completion_tokens = max(1, math.ceil(size / 4))
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def sse(event: Mapping[str, Any] | str) -> bytes:
    """One server-sent event in OpenAI's framing: `data: <json>` and a blank line."""
    data = event.encode() if isinstance(event, str) else orjson.dumps(event)
    return b"data: " + data + b"\n\n"


def stream_frames(body: Mapping[str, Any], *, include_usage: bool, pieces: int = 3) -> list[bytes]:
    """The SSE frames OpenAI would send for `body` (a completion_body), ending with [DONE]."""
    choice, usage = body["choices"][0], body["usage"]
    head = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
        "system_fingerprint": body["system_fingerprint"],
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        frame = {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            frame["usage"] = None
        return frame

    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    text = choice["message"].get("content") or ""
    step = max(1, math.ceil(len(text) / pieces))
    deltas += [{"content": text[i : i + step]} for i in range(0, len(text), step)]
    for index, call in enumerate(choice["message"].get("tool_calls") or []):
        function = call.get("function", {})
        arguments = function.get("arguments", "")
        half = len(arguments) // 2
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.get("id"),
                        "type": "function",
                        "function": {"name": function.get("name"), "arguments": arguments[:half]},
                    }
                ]
            }
        )
        rest = {"index": index, "function": {"arguments": arguments[half:]}}
        deltas.append({"tool_calls": [rest]})
    frames = [sse(chunk(delta)) for delta in deltas]
    frames.append(sse(chunk({}, choice["finish_reason"])))
    if include_usage:
        frames.append(sse({**head, "choices": [], "usage": usage}))
    frames.append(sse("[DONE]"))
    return frames


def _invalid(message: str, param: str | None = None) -> web.Response:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return web.json_response({"error": error}, status=400)


def make_echo_app(context_window: int = 4096, chars_per_token: float = 4.0) -> web.Application:
    """The demo upstream as an aiohttp application (embedded by `start_echo_upstream`)."""

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            payload = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _invalid("We could not parse the JSON body of your request.")
        if not isinstance(payload, dict):
            return _invalid("The request body must be a JSON object.")
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            return _invalid("'messages' must be a non-empty array.", "messages")
        max_tokens = payload.get("max_completion_tokens") or payload.get("max_tokens") or 0
        max_tokens = max_tokens if type(max_tokens) is int and max_tokens > 0 else 0
        try:
            prompt = estimate_prompt_tokens(payload, chars_per_token)
        except orjson.JSONEncodeError:  # nested deeper than providers take: they refuse it too
            return _invalid("The request body is nested too deeply.")
        if prompt + max_tokens > context_window:
            body = context_error_body(context_window, prompt, max_tokens)
            return web.Response(
                status=400, body=orjson.dumps(body), content_type="application/json"
            )
        text = " ".join(latest_user_text(messages).split())[:80]
        content = f"echo: {text} [saw {len(messages)} messages, ~{prompt} prompt tokens]"
        body = completion_body(content=content, prompt_tokens=prompt)
        if payload.get("stream") is not True:
            return web.Response(body=orjson.dumps(body), content_type="application/json")
        options = payload.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for frame in stream_frames(body, include_usage=include_usage):
            await response.write(frame)
        await response.write_eof()
        return response

    async def models(_: web.Request) -> web.Response:
        card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "compactgate-demo"}
        return web.json_response({"object": "list", "data": [card]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app


@dataclass
class EchoUpstream:
    """The demo upstream ready to be embedded in the gateway (`upstream.provider: in_process`):
    `base_url` names it, `servers` is what `build_app` takes. No port is opened."""

    base_url: str
    servers: dict[str, ServerFactory]
    runner: web.AppRunner

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_echo_upstream(context_window: int = 4096) -> EchoUpstream:
    """The demo upstream, set up in the running event loop for the gateway to embed."""
    runner = web.AppRunner(make_echo_app(context_window), access_log=None)
    await runner.setup()
    assert runner.server is not None
    return EchoUpstream(f"http://{MODEL}/v1", {MODEL: runner.server}, runner)
