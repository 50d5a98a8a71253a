"""The test suite's stand-in for the upstream LLM, run as a real process.

    python -m tests.fake_upstream --port 0      # prints "READY <port>" once listening

It speaks OpenAI's wire format (bodies and SSE framing from `gateway.devtools.echo_upstream`), records
every request it receives, and misbehaves on demand, so end-to-end tests can drive the gateway
through every upstream failure without a real model. The upstream is the only thing tests may
fake; this is it.

Control endpoints (JSON; nothing under /_fake/ is recorded):

    GET  /_fake/requests   every recorded request: method, path, query, headers ([name, value]
                           pairs in order), body_b64 (raw bytes), json (parsed, or null; also
                           null for a body nested deeper than it can be written back)
    POST /_fake/reset      clear records, script, config and counters; cancel hung handlers
    POST /_fake/script     append behaviours (a JSON list), consumed one per chat request, FIFO
    POST /_fake/release    let a held-back streamed legacy completion finish
    POST /_fake/config     {"context_limit": N|null, "style": name, "usage_tokenizer": "chars:X",
                            "remote_compaction": bool}
    GET  /_fake/inflight   {"inflight", "started", "completed", "cancelled"} of the chat,
                           Responses and Messages routes; `cancelled` counts requests ended by
                           the client disconnecting

Behaviours (`kind` plus parameters; an empty script means {"kind": "ok"}):

    ok                   content?, prompt_tokens?, completion_tokens?, finish_reason?
    tool_calls           tool_calls: [{id?, function: {name, arguments: str|object}}], content?
    error                status, body (JSON) or raw (text), headers? (e.g. Retry-After)
    drop                 close the connection without any response
    hang_before_headers  seconds; then answers like ok
    hang_mid_stream      after_chunks, seconds; then finishes normally
    drop_mid_stream      after_chunks; then closes the connection
    stream_error_event   body?; 200 text/event-stream, one `data: {"error": ...}` event, end
    empty_200            200 with an empty body (llama-cpp-python's streaming quirk)
    slow_stream          chunks, interval; content in `chunks` pieces, `interval` s apart
    context_limit        limit, style; that provider's context error iff prompt > limit, else ok
    not_json, truncated, bad_framing, no_final, hang
                         a 200 that is not the API's answer, streamed or not (an HTML page,
                         half the body, events without their field names, no last event, or
                         nothing ever: `tests.fake_agent_apis.malformed`)

`GET /v1/models` lists `fake-model`; `GET /v1/models/{id}` answers any id as a model it serves;
`POST /v1/embeddings` answers one embedding; a streamed `POST /v1/completions` answers one
legacy completion event, and two more with [DONE] once `POST /_fake/release` comes (10 s at most); any other `/v1/*` path echoes what it received.

`/v1/responses` and `/v1/messages` answer from the same script and settings in their own wire
formats and enforce the providers' pairing and signature rules: see `tests.fake_agent_apis`
(streamed `/v1/responses` also takes `slow_stream` with `interval`, and `drop_mid_stream`).

Non-streaming requests get the same behaviours: "chunks" are then halves of the JSON body.
The global `context_limit` is checked before the script; a request it rejects consumes nothing.
Prompt size is the fake's own tokenizer: characters of the JSON of messages and tools divided by
the `usage_tokenizer` ratio (default chars:4), also reported as `usage.prompt_tokens`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from aiohttp import web

from gateway.devtools.echo_upstream import (
    completion_body,
    context_error_body,
    estimate_prompt_tokens,
    latest_user_text,
    sse,
    stream_frames,
)
from tests.fake_agent_apis import MALFORMED, add_routes, malformed

JSON = dict[str, Any]
STYLES = (
    "openai", "azure", "anthropic", "vllm", "llamacpp", "llama-cpp-python", "ollama", "gemini",
    "bedrock", "openrouter", "litellm", "openai_compatible",
)  # fmt: skip


def _dumps(value: object) -> bytes:
    return orjson.dumps(value)


def render_context_error(
    style: str, limit: int, prompt: int, max_tokens: int = 0
) -> tuple[int, dict[str, str], bytes]:
    """That provider's context-window error, shaped like its fixture in fixtures/context_errors."""
    anthropic = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {prompt} tokens > {limit} maximum",
        },
        "request_id": "req_fake0000000000000000",
    }
    llamacpp = {
        "error": {
            "code": 400,
            "message": f"request ({prompt} tokens) exceeds the "
            f"available context size ({limit} tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt,
            "n_ctx": limit,
        }
    }
    json_type = {"Content-Type": "application/json"}
    if style in ("openai", "azure"):
        return 400, json_type, _dumps(context_error_body(limit, prompt, max_tokens))
    if style == "anthropic":
        return 400, json_type, _dumps(anthropic)
    if style == "vllm":
        message = (
            f"This model's maximum context length is {limit} tokens. However, your request"
            f" has {prompt} input tokens. Please reduce the length of the input messages."
        )
        body: object = {
            "error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}
        }
        return 400, json_type, _dumps(body)
    if style == "llamacpp":
        return 400, json_type, _dumps(llamacpp)
    if style in ("llama-cpp-python", "openai_compatible"):
        completion = max_tokens or None
        message = (
            f"This model's maximum context length is {limit} tokens. However, you requested"
            f" {prompt + max_tokens} tokens ({prompt} in the messages, {completion} in the "
            "completion). Please reduce the length of the messages or completion."
        )
        code = "context_length_exceeded" if style == "llama-cpp-python" else "invalid_request_error"
        param = "messages" if style == "llama-cpp-python" else None
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": code,
            }
        }
        return 400, json_type, _dumps(body)
    if style == "ollama":
        body = {
            "error": {
                "message": _dumps(llamacpp).decode(),
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        return 400, json_type, _dumps(body) + b"\n"
    if style == "gemini":
        message = (
            f"The input token count ({prompt}) exceeds the maximum number of tokens "
            f"allowed ({limit})."
        )
        body = [{"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}]
        return 400, json_type, _dumps(body)
    if style == "bedrock":
        headers = {**json_type, "x-amzn-ErrorType": "ValidationException"}
        return 400, headers, _dumps({"message": "Input is too long for requested model."})
    if style == "openrouter":
        parts = f"{prompt} of text input" + (f", {max_tokens} in the output" if max_tokens else "")
        message = (
            f"This endpoint's maximum context length is {limit} tokens. However, you "
            f"requested about {prompt + max_tokens} tokens ({parts}). Please reduce the "
            'length of either one, or use the "middle-out" transform to compress your '
            "prompt automatically."
        )
        body = {"error": {"message": message, "code": 400, "metadata": {"provider_name": None}}}
        return 400, json_type, _dumps(body)
    if style == "litellm":
        inner = _dumps(anthropic).decode()
        message = (
            f"litellm.BadRequestError: litellm.ContextWindowExceededError: AnthropicError - "
            f"{inner}\nReceived Model Group=fake\nAvailable Model Group Fallbacks=None"
        )
        body = {"error": {"message": message, "type": None, "param": None, "code": "400"}}
        return 400, json_type, _dumps(body)
    raise ValueError(f"unknown context error style {style!r}; known: {', '.join(STYLES)}")


@dataclass
class Config:
    """The global settings of POST /_fake/config."""

    context_limit: int | None = None
    style: str = "openai"
    chars_per_token: float = 4.0
    remote_compaction: bool = False  # POST /v1/responses/compact answers as OpenAI's does

    @classmethod
    def parse(cls, data: object) -> Config:
        keys = {"context_limit", "style", "usage_tokenizer", "remote_compaction"}
        if not isinstance(data, dict) or set(data) - keys:
            raise ValueError("config keys: " + ", ".join(sorted(keys)))
        limit = data.get("context_limit")
        if limit is not None and (type(limit) is not int or limit <= 0):
            raise ValueError("context_limit must be a positive integer or null")
        style = data.get("style", "openai")
        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}")
        tokenizer = data.get("usage_tokenizer", "chars:4")
        kind, _, ratio = str(tokenizer).partition(":")
        if kind != "chars" or not ratio.replace(".", "", 1).isdigit() or float(ratio) <= 0:
            raise ValueError('usage_tokenizer must look like "chars:3.1"')
        remote = data.get("remote_compaction", False)
        if not isinstance(remote, bool):
            raise ValueError("remote_compaction must be a boolean")
        return cls(limit, style, float(ratio), remote)


@dataclass
class State:
    """Everything the fake remembers between requests; reset wipes it."""

    records: list[JSON] = field(default_factory=list)
    script: deque[JSON] = field(default_factory=deque)
    config: Config = field(default_factory=Config)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    started: int = 0
    completed: int = 0
    cancelled: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)  # see legacy completions

    def reset(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.tasks = set()
        self.release = asyncio.Event()
        self.records, self.script, self.config = [], deque(), Config()
        self.started = self.completed = self.cancelled = 0

    def queue(self, behaviours: object) -> int:
        """Append behaviours to the script; returns how many are queued."""
        if not isinstance(behaviours, list) or not all(isinstance(b, dict) for b in behaviours):
            raise ValueError("script must be a JSON list of objects")
        self.script.extend(behaviours)
        return len(self.script)

    def counters(self) -> JSON:
        return {
            "inflight": len(self.tasks),
            "started": self.started,
            "completed": self.completed,
            "cancelled": self.cancelled,
        }


class Exchange:
    """One chat request being answered: its parsed body and how to write the answer."""

    def __init__(self, request: web.Request, payload: JSON, state: State) -> None:
        self.request, self.payload, self.state = request, payload, state
        self.stream = payload.get("stream") is True
        options = payload.get("stream_options")
        self.include_usage = isinstance(options, dict) and options.get("include_usage") is True
        self.prompt = estimate_prompt_tokens(payload, state.config.chars_per_token)
        self.dropped_by_us = False

    def body(self, behaviour: JSON) -> JSON:
        model = self.payload.get("model") if isinstance(self.payload.get("model"), str) else None
        messages = self.payload.get("messages")
        calls = [_tool_call(i, c) for i, c in enumerate(behaviour.get("tool_calls") or [])]
        text = latest_user_text(messages if isinstance(messages, list) else [])
        default = None if calls else f"echo: {text[:80]}"
        return completion_body(
            content=behaviour.get("content", default),
            prompt_tokens=behaviour.get("prompt_tokens", self.prompt),
            model=model or "fake-model",
            tool_calls=calls or None,
            finish_reason=behaviour.get("finish_reason", "tool_calls" if calls else "stop"),
            completion_tokens=behaviour.get("completion_tokens"),
            fingerprint="fp_compactgate_fake_upstream",
        )

    def pieces(self, body: JSON, pieces: int = 3) -> list[bytes]:
        if self.stream:
            return stream_frames(body, include_usage=self.include_usage, pieces=pieces)
        raw = _dumps(body)
        return [raw[: len(raw) // 2], raw[len(raw) // 2 :]]

    async def start(self, status: int = 200, length: int | None = None) -> web.StreamResponse:
        kind = "text/event-stream" if self.stream else "application/json"
        response = web.StreamResponse(status=status, headers={"Content-Type": kind})
        if length is not None:
            response.content_length = length
        await response.prepare(self.request)
        return response

    async def send(
        self,
        parts: list[bytes],
        *,
        pause_after: int = -1,
        pause: float = 0,
        drop_after: int = -1,
        interval: float = 0,
    ) -> web.StreamResponse:
        response = await self.start(length=None if self.stream else sum(map(len, parts)))
        for index, part in enumerate(parts):
            if index == drop_after:
                return self.drop(response)
            if index == pause_after:
                await asyncio.sleep(pause)
            elif index and interval:
                await asyncio.sleep(interval)
            await response.write(part)
        await response.write_eof()
        return response

    def drop(self, response: web.StreamResponse | None = None) -> web.StreamResponse:
        """Close the connection; `response` is the one already started, if any."""
        self.dropped_by_us = True
        transport = self.request.transport
        if transport is not None:
            transport.close()
        return response if response is not None else web.Response()


def _tool_call(index: int, call: object) -> JSON:
    call = call if isinstance(call, dict) else {}
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = _dumps(arguments).decode()
    return {
        "id": call.get("id") or f"call_fake_{index}",
        "type": "function",
        "function": {"name": function.get("name", "tool"), "arguments": arguments},
    }


async def _answer(x: Exchange, behaviour: JSON) -> web.StreamResponse:
    """Carry out one behaviour (see the module docstring)."""
    kind = behaviour.get("kind", "ok")
    after = int(behaviour.get("after_chunks", 1))
    if kind in ("ok", "tool_calls"):
        return await x.send(x.pieces(x.body(behaviour)))
    if kind == "error":
        headers = {str(k): str(v) for k, v in (behaviour.get("headers") or {}).items()}
        if "raw" in behaviour:
            headers.setdefault("Content-Type", "text/plain")
            raw = str(behaviour["raw"]).encode()
        else:
            headers.setdefault("Content-Type", "application/json")
            raw = _dumps(behaviour.get("body", {"error": {"message": "fake error"}}))
        return web.Response(status=int(behaviour.get("status", 500)), body=raw, headers=headers)
    if kind == "drop":
        return x.drop()
    if kind == "hang_before_headers":
        await asyncio.sleep(float(behaviour.get("seconds", 3600)))
        return await x.send(x.pieces(x.body(behaviour)))
    if kind == "hang_mid_stream":
        seconds = float(behaviour.get("seconds", 3600))
        return await x.send(x.pieces(x.body(behaviour)), pause_after=after, pause=seconds)
    if kind == "drop_mid_stream":
        return await x.send(x.pieces(x.body(behaviour)), drop_after=after)
    if kind == "stream_error_event":
        error = behaviour.get("body") or context_error_body(4096, x.prompt, 0)
        response = await x.start()
        await response.write(sse(error) if x.stream else _dumps(error))
        await response.write_eof()
        return response
    if kind == "empty_200":
        response = await x.start(length=0)
        await response.write_eof()
        return response
    if kind == "slow_stream":
        chunks = max(1, int(behaviour.get("chunks", 5)))
        interval = float(behaviour.get("interval", 0.1))
        body = x.body({"content": behaviour.get("content", "slow " * chunks), **behaviour})
        return await x.send(x.pieces(body, pieces=chunks), interval=interval)
    if kind in MALFORMED:
        frames = x.pieces(x.body(behaviour))
        whole = b"".join(frames) if not x.stream else _dumps(x.body(behaviour))
        return await malformed(x.request, kind, x.stream, frames, whole)
    if kind == "context_limit":
        limit = int(behaviour["limit"])
        if x.prompt > limit:
            return _context_error(x, behaviour.get("style", "openai"), limit)
        return await x.send(x.pieces(x.body(behaviour)))
    return web.json_response(
        {"error": {"message": f"fake upstream: unknown kind {kind!r}"}}, status=500
    )


def _context_error(x: Exchange, style: str, limit: int) -> web.Response:
    max_tokens = x.payload.get("max_completion_tokens") or x.payload.get("max_tokens") or 0
    max_tokens = max_tokens if type(max_tokens) is int else 0
    status, headers, raw = render_context_error(style, limit, x.prompt, max_tokens)
    return web.Response(status=status, body=raw, headers=headers)


def _record(request: web.Request, raw: bytes) -> JSON:
    try:
        parsed = orjson.loads(raw) if raw else None
        orjson.dumps(parsed)  # the record must be written to the test (not nested too deeply)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        parsed = None
    return {
        "method": request.method,
        "path": request.path,
        "query": request.query_string,
        "headers": [[k, v] for k, v in request.headers.items()],
        "body_b64": base64.b64encode(raw).decode(),
        "json": parsed,
        "time": time.time(),
    }


def make_app(state: State) -> web.Application:
    """The fake as an aiohttp application over `state`."""

    @web.middleware
    async def recorder(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if not request.path.startswith("/_fake/"):
            state.records.append(_record(request, await request.read()))
        return await handler(request)

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            payload = orjson.loads(await request.read())
            orjson.dumps(payload)  # nested deeper than a provider takes: refused, as they do
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):
            payload = None
        if not isinstance(payload, dict):
            return web.json_response(
                {
                    "error": {
                        "message": "fake upstream: body is not a JSON object",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
                status=400,
            )
        task = asyncio.current_task()
        assert task is not None
        state.tasks.add(task)
        state.started += 1
        exchange = Exchange(request, payload, state)
        try:
            limit = state.config.context_limit
            if limit is not None and exchange.prompt > limit:
                response: web.StreamResponse = _context_error(exchange, state.config.style, limit)
            else:
                behaviour = state.script.popleft() if state.script else {"kind": "ok"}
                response = await _answer(exchange, behaviour)
        except (asyncio.CancelledError, ConnectionResetError):
            if task in state.tasks and not exchange.dropped_by_us:  # not a reset, not our drop
                state.cancelled += 1
            raise
        finally:
            state.tasks.discard(task)
        state.completed += 1
        return response

    async def models(_: web.Request) -> web.Response:
        data = [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]
        return web.json_response({"object": "list", "data": data})

    async def model(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return web.json_response({"id": name, "object": "model", "created": 0, "owned_by": "fake"})

    async def passthrough(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if (
            request.method == "POST"
            and request.path == "/v1/completions"
            and b'"stream":true' in (raw.replace(b" ", b""))
        ):
            return await legacy_completion_stream(request)
        if request.method == "POST" and request.path == "/v1/embeddings":
            data = [{"object": "embedding", "index": 0, "embedding": [0.0, 0.1, 0.2]}]
            return web.json_response(
                {
                    "object": "list",
                    "data": data,
                    "model": "fake-embedding",
                    "usage": {"prompt_tokens": 1, "total_tokens": 1},
                }
            )
        return web.json_response(
            {
                "object": "fake.passthrough",
                "method": request.method,
                "path": request.path,
                "query": request.query_string,
                "body_b64": base64.b64encode(raw).decode(),
            }
        )

    async def legacy_completion_stream(request: web.Request) -> web.StreamResponse:
        """A streamed legacy completion: one piece, then (once POST /_fake/release came, or
        after 10 s) two more and [DONE]."""
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for index, text in enumerate(("one ", "two ", "three")):
            if index == 1:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.release.wait(), 10)
            piece = {"id": "cmpl-fake", "object": "text_completion", "model": "fake-model",
                     "choices": [{"index": 0, "text": text, "finish_reason": None}]}  # fmt: skip
            await response.write(b"data: " + _dumps(piece) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def control_requests(_: web.Request) -> web.Response:
        return web.Response(body=_dumps(state.records), content_type="application/json")

    async def control_release(_: web.Request) -> web.Response:
        state.release.set()
        return web.json_response({"ok": True})

    async def control_reset(_: web.Request) -> web.Response:
        state.reset()
        return web.json_response({"ok": True})

    async def control_script(request: web.Request) -> web.Response:
        try:
            queued = state.queue(orjson.loads(await request.read()))
        except (ValueError, orjson.JSONDecodeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"queued": queued})

    async def control_config(request: web.Request) -> web.Response:
        try:
            state.config = Config.parse(orjson.loads(await request.read()))
        except (ValueError, orjson.JSONDecodeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True})

    async def control_inflight(_: web.Request) -> web.Response:
        return web.json_response(state.counters())

    app = web.Application(middlewares=[recorder], client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{name}", model)
    add_routes(app, state)  # /v1/responses, /v1/messages (+ count_tokens)
    app.router.add_route("*", "/v1/{tail:.*}", passthrough)
    app.router.add_get("/_fake/requests", control_requests)
    app.router.add_post("/_fake/reset", control_reset)
    app.router.add_post("/_fake/release", control_release)
    app.router.add_post("/_fake/script", control_script)
    app.router.add_post("/_fake/config", control_config)
    app.router.add_get("/_fake/inflight", control_inflight)
    return app


async def serve(host: str, port: int) -> None:
    """Listen until SIGTERM or SIGINT, announcing the bound port on stdout."""
    runner = web.AppRunner(make_app(State()), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"READY {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fake_upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port))


class FakeUpstream:
    """The tests' handle on a running fake: its URL and its control endpoints."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.root = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.root}/v1"
        self._http = httpx.Client(base_url=self.root, timeout=10)

    def _call(self, method: str, path: str, payload: object = None) -> Any:
        response = self._http.request(
            method, path, content=None if payload is None else _dumps(payload)
        )
        response.raise_for_status()
        return response.json()

    def requests(self) -> list[JSON]:
        return self._call("GET", "/_fake/requests")

    def chat_requests(self) -> list[JSON]:
        return [r for r in self.requests() if r["path"] == "/v1/chat/completions"]

    def reset(self) -> None:
        self._call("POST", "/_fake/reset")

    def script(self, behaviours: list[JSON]) -> None:
        self._call("POST", "/_fake/script", behaviours)

    def configure(self, config: JSON) -> None:
        self._call("POST", "/_fake/config", config)

    def release(self) -> None:
        self._call("POST", "/_fake/release")

    def inflight(self) -> JSON:
        return self._call("GET", "/_fake/inflight")

    def wait_idle(self, timeout: float = 5.0) -> JSON:
        """Poll until no chat request is in flight; returns the last counters."""
        deadline = time.monotonic() + timeout
        for counters in self._poll():
            if counters["inflight"] == 0 or time.monotonic() > deadline:
                return counters
        raise AssertionError("unreachable")

    def _poll(self) -> Iterator[JSON]:
        while True:
            yield self.inflight()
            time.sleep(0.02)

    def close(self) -> None:
        self._http.close()


if __name__ == "__main__":
    main(sys.argv[1:])
