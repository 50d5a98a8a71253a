"""The fake upstream's Responses and Anthropic Messages endpoints, with the providers' rules.

`POST /v1/responses`, `POST /v1/messages` and `POST /v1/messages/count_tokens` answer from the
same script and settings as the fake's chat route (`tests.fake_upstream`: `/_fake/script`,
`/_fake/config` `context_limit`), in each API's real wire format: the JSON bodies, the SSE event
sequences (`response.created` ... `response.completed` with sequence numbers; `message_start`
... `message_stop` with `ping` and cumulative usage), the context-window errors and the error
envelopes. Behaviours they know:

    ok                  content?, prompt_tokens?, completion_tokens?
    tool_calls          tool_calls: [{id?, name, arguments: object|str}], content?, reasoning?
                        (reasoning: true puts a reasoning item / thinking block before the calls)
    error               status, body
    context_limit       limit: the API's own context error iff the prompt is over it
    stream_error_event  a stream whose first event is the API's error event (prompt too long)
    expand              call the first tool the request offers (the gateway's read tool) with the
                        first `ref=` of a masked output in the request: {"ref_id": ...}; with
                        also: [tool_calls] the client's calls come in the same answer
    not_json, truncated, bad_framing, no_final, hang
                        a 200 that is not the API's answer, streamed or not (`malformed`)

Before answering, each request is checked against the rules the real providers enforce, and
broken ones get the provider's 400 (so a gateway that breaks them fails the test that sent it):

* Responses: a `function_call_output` needs its `function_call` (by `call_id`) earlier in the
  input; a `function_call` this fake issued after a reasoning item needs that reasoning item
  before it; a reasoning item's `encrypted_content` must be the bytes this fake issued; so must
  a `compaction` item's (400 `invalid_encrypted_content`: a compaction item made elsewhere, such
  as the gateway's own, cannot be read here).
* Messages: a `tool_use` needs its `tool_result` in the next user turn and a `tool_result` its
  `tool_use` in the previous assistant turn; a thinking block's `signature` must be one this fake
  issued for that text; at most 4 `cache_control` breakpoints; no `compaction` block (this fake,
  like most upstreams, does not implement Anthropic's compaction).

`POST /v1/responses/compact` is OpenAI's remote compaction: with `/_fake/config`
`remote_compaction: true` it answers as OpenAI does (the input's user messages, then one
`compaction` item of this fake's own); otherwise it is a 404, as on upstreams that do not
implement it. `compact_requests` counts what reached it.

A request whose latest user text asks for a compaction summary (the phrases in
`SUMMARY_PROMPTS`, as Codex CLI and Claude Code ask) is answered with a summary, as a model
would, without consuming the script: `summary_requests` counts them.

The prompt size is the characters of the JSON of the system prompt, the conversation and the tools
divided by the fake's `usage_tokenizer` ratio (chars:4 by default), and is reported as usage.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import orjson
from aiohttp import web

JSON = dict[str, Any]
_ids = itertools.count(1)
RESPONSES_CONTEXT_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)


class Issued:
    """What this fake handed out that a client must send back unchanged."""

    def __init__(self) -> None:
        self.encrypted: dict[str, str] = {}  # reasoning item id -> encrypted_content
        self.reasoning_of: dict[str, str] = {}  # function_call id -> its reasoning item id
        self.signatures: dict[str, str] = {}  # signature -> thinking text
        self.compactions: set[str] = set()  # encrypted_content of compaction items


ISSUED = Issued()
SUMMARY_PROMPTS = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION",
    "CRITICAL: Respond with TEXT ONLY",
)


def latest_user_text(payload: Mapping[str, Any]) -> str:
    conversation = payload.get("input") or payload.get("messages") or []
    for item in reversed(conversation if isinstance(conversation, list) else []):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            texts = [b.get("text", "") for b in content or [] if isinstance(b, dict)]
            return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def asks_for_summary(payload: Mapping[str, Any]) -> bool:
    text = latest_user_text(payload).lstrip()
    return any(text.startswith(p) or f"\n{p}" in text for p in SUMMARY_PROMPTS)


def summary_requests(records: list[Any]) -> list[Any]:
    """The recorded requests that asked this fake for a compaction summary."""
    return [r for r in records if isinstance(r.get("json"), dict) and asks_for_summary(r["json"])]


def prompt_tokens(payload: Mapping[str, Any], chars_per_token: float) -> int:
    parts = [payload.get(k) for k in ("instructions", "system", "input", "messages", "tools")]
    return max(1, round(len(orjson.dumps(parts)) / chars_per_token))


# -- rules ----------------------------------------------------------------------------------


def compaction_problem(payload: Mapping[str, Any]) -> str | None:
    """A compaction item this fake did not issue: it cannot be read here."""
    items = payload.get("input")
    for index, item in enumerate(items if isinstance(items, list) else ()):
        if isinstance(item, dict) and item.get("type") == "compaction":
            if item.get("encrypted_content") not in ISSUED.compactions:
                return f"The encrypted content for item input[{index}] could not be verified."
    return None


def compact_requests(records: list[Any]) -> list[Any]:
    """The recorded requests that reached `/v1/responses/compact`."""
    return [r for r in records if r.get("path") == "/v1/responses/compact"]


def responses_problem(payload: Mapping[str, Any]) -> str | None:
    items = payload.get("input")
    if not isinstance(items, list) or payload.get("previous_response_id"):
        return None
    calls: set[str] = set()
    seen_reasoning: set[str] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "reasoning":
            issued = ISSUED.encrypted.get(str(item.get("id")))
            if issued is not None and item.get("encrypted_content") != issued:
                return "The encrypted content for item rs could not be verified."
            seen_reasoning.add(str(item.get("id")))
        elif kind == "function_call":
            calls.add(str(item.get("call_id")))
            needed = ISSUED.reasoning_of.get(str(item.get("id")))
            if needed is not None and needed not in seen_reasoning:
                return (
                    f"Item '{item.get('id')}' of type 'function_call' was provided without its "
                    f"required 'reasoning' item: '{needed}'."
                )
        elif kind == "function_call_output" and str(item.get("call_id")) not in calls:
            return (
                f"No tool call found for function call output with call_id {item.get('call_id')}."
            )
    return None


def messages_problem(payload: Mapping[str, Any]) -> str | None:
    turns = payload.get("messages")
    if not isinstance(turns, list):
        return "messages: Field required"
    breakpoints = 0
    system = payload.get("system")
    for block in system if isinstance(system, list) else []:
        breakpoints += isinstance(block, dict) and "cache_control" in block
    for tool in payload.get("tools") or []:
        breakpoints += isinstance(tool, dict) and "cache_control" in tool
    pending: list[str] = []
    for index, turn in enumerate(turns):
        content = turn.get("content") if isinstance(turn, dict) else None
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        breakpoints += sum("cache_control" in b for b in blocks)
        for position, block in enumerate(blocks):
            if block.get("type") == "compaction":
                return (
                    f"messages.{index}.content.{position}: Input tag 'compaction' found using "
                    "'type' does not match any of the expected tags"
                )
        if turn.get("role") == "user":
            results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
            for result in results:
                if result not in pending:
                    return (
                        f"messages.{index}.content: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {result}. Each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message."
                    )
            missing = [p for p in pending if p not in results]
            if missing:
                return (
                    f"messages.{index}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )
            pending = []
        else:
            if pending:
                return (
                    f"messages.{index}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(pending)}."
                )
            pending = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
            for block in blocks:
                if block.get("type") == "thinking":
                    text = ISSUED.signatures.get(str(block.get("signature")))
                    if text is None or text != block.get("thinking"):
                        return f"messages.{index}.content: Invalid `signature` in `thinking` block"
    if breakpoints > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
    return None


# -- answers ----------------------------------------------------------------------------------


def _calls(behaviour: Mapping[str, Any]) -> list[JSON]:
    calls = []
    for call in behaviour.get("tool_calls") or []:
        arguments = call.get("arguments", {})
        calls.append(
            {
                "id": call.get("id") or f"call_{next(_ids)}",
                "name": call.get("name", "tool"),
                "arguments": arguments
                if isinstance(arguments, str)
                else orjson.dumps(arguments).decode(),
            }
        )
    return calls


def responses_body(payload: Mapping[str, Any], behaviour: Mapping[str, Any], prompt: int) -> JSON:
    output: list[JSON] = []
    calls = _calls(behaviour)
    reasoning_id = None
    if behaviour.get("reasoning") and calls:
        reasoning_id = f"rs_{next(_ids)}"
        encrypted = f"gAAAAfake{next(_ids)}" + "x" * 16
        ISSUED.encrypted[reasoning_id] = encrypted
        output.append(
            {"type": "reasoning", "id": reasoning_id, "summary": [], "encrypted_content": encrypted}
        )
    text = behaviour.get("content", None if calls else "fake answer")
    if text:
        output.append(
            {
                "type": "message",
                "id": f"msg_{next(_ids)}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in calls:
        item_id = f"fc_{next(_ids)}"
        if reasoning_id is not None:
            ISSUED.reasoning_of[item_id] = reasoning_id
        output.append(
            {
                "type": "function_call",
                "id": item_id,
                "call_id": call["id"],
                "name": call["name"],
                "arguments": call["arguments"],
                "status": "completed",
            }
        )
    completion = int(behaviour.get("completion_tokens", 7))
    return {
        "id": f"resp_{next(_ids)}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": payload.get("model", "fake-model"),
        "output": output,
        "usage": {
            "input_tokens": int(behaviour.get("prompt_tokens", prompt)),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": int(behaviour.get("prompt_tokens", prompt)) + completion,
        },
    }


def responses_events(body: JSON) -> Iterator[JSON]:
    """The SSE events of `body`, as the Responses API streams it."""
    shell = {**body, "status": "in_progress", "output": [], "usage": None}
    yield {"type": "response.created", "response": shell}
    yield {"type": "response.in_progress", "response": shell}
    for index, item in enumerate(body["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "status": "in_progress", "content": []},
            }
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield {"type": "response.content_part.added", **where, "part": part}
            for piece in _pieces(text):
                yield {"type": "response.output_text.delta", **where, "delta": piece}
            yield {"type": "response.output_text.done", **where, "text": text}
            yield {"type": "response.content_part.done", **where, "part": {**part, "text": text}}
        elif item["type"] == "function_call":
            yield {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "arguments": "", "status": "in_progress"},
            }
            for piece in _pieces(item["arguments"]):
                yield {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "delta": piece,
                }
            yield {
                "type": "response.function_call_arguments.done",
                "item_id": item["id"],
                "output_index": index,
                "arguments": item["arguments"],
            }
        else:
            yield {"type": "response.output_item.added", "output_index": index, "item": item}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    yield {"type": "response.completed", "response": body}


def messages_body(payload: Mapping[str, Any], behaviour: Mapping[str, Any], prompt: int) -> JSON:
    content: list[JSON] = []
    calls = _calls(behaviour)
    if behaviour.get("reasoning") and calls:
        thought = f"I should call a tool ({next(_ids)})."
        signature = f"EqFakeSig{next(_ids)}=="
        ISSUED.signatures[signature] = thought
        content.append({"type": "thinking", "thinking": thought, "signature": signature})
    text = behaviour.get("content", None if calls else "fake answer")
    if text:
        content.append({"type": "text", "text": text})
    for call in calls:
        content.append(
            {
                "type": "tool_use",
                "id": call["id"] if call["id"].startswith("toolu_") else f"toolu_{call['id']}",
                "name": call["name"],
                "input": orjson.loads(call["arguments"]),
            }
        )
    return {
        "id": f"msg_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": payload.get("model", "fake-model"),
        "content": content,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": int(behaviour.get("prompt_tokens", prompt)),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": int(behaviour.get("completion_tokens", 7)),
        },
    }


def messages_events(body: JSON) -> Iterator[tuple[str, JSON]]:
    start = {
        **body,
        "content": [],
        "stop_reason": None,
        "usage": {**body["usage"], "output_tokens": 1},
    }
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            yield (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
            yield "ping", {"type": "ping"}
            for piece in _pieces(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                yield (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
        elif block["type"] == "thinking":
            yield (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                },
            )
            for piece in _pieces(block["thinking"]):
                delta = {"type": "thinking_delta", "thinking": piece}
                yield (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            delta = {"type": "signature_delta", "signature": block["signature"]}
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        else:
            yield (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "input": {}},
                },
            )
            for piece in _pieces(orjson.dumps(block["input"]).decode()):
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
            "usage": body["usage"],
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _pieces(text: str, count: int = 3) -> list[str]:
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _frame(name: str, data: JSON) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


# -- handlers ---------------------------------------------------------------------------------


def anthropic_error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"}
    return web.json_response(body, status=status, headers={"request-id": "req_fake"})


def openai_error(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> web.Response:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }
    return web.json_response(body, status=status, headers={"x-request-id": "req_fake"})


async def _payload(request: web.Request) -> JSON | None:
    try:
        payload = orjson.loads(await request.read())
        orjson.dumps(payload)  # nested deeper than a provider takes: refused, as they do
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    return payload if isinstance(payload, dict) else None


def _expanded(payload: Mapping[str, Any], step: JSON) -> JSON:
    """An `expand` behaviour as the tool call it makes."""
    if step.get("kind") != "expand":
        return step
    raw = orjson.dumps(payload).decode()
    found = re.search(r"ref=(ref_[0-9a-f]+)", raw)
    tools = payload.get("tools") or [{}]
    name = tools[-2].get("name", "tool") if len(tools) >= 2 else "tool"  # read, then grep
    call = {"name": name, "arguments": {"ref_id": found.group(1) if found else "none"}}
    return {**step, "kind": "tool_calls", "tool_calls": [call, *step.get("also", [])]}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def tracked(state: Any, handler: Handler) -> Handler:
    """`handler` counted in the fake's counters as its chat route is (`/_fake/inflight`:
    in flight, started, completed, and cancelled by the client hanging up)."""

    async def counted(request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        state.tasks.add(task)
        state.started += 1
        try:
            response = await handler(request)
        except (asyncio.CancelledError, ConnectionResetError):
            if task in state.tasks:  # not a reset
                state.cancelled += 1
            raise
        finally:
            state.tasks.discard(task)
        state.completed += 1
        return response

    return counted


def add_routes(app: web.Application, state: Any) -> None:
    """Register the endpoints on the fake's app (before its catch-all passthrough)."""

    def behaviour() -> JSON:
        return state.script.popleft() if state.script else {"kind": "ok"}

    async def responses(request: web.Request) -> web.StreamResponse:
        payload = await _payload(request)
        if payload is None:
            return openai_error(400, "We could not parse the JSON body of your request.")
        unreadable = compaction_problem(payload)
        if unreadable is not None:
            return openai_error(400, unreadable, "invalid_encrypted_content", "input")
        problem = responses_problem(payload)
        if problem is not None:
            return openai_error(400, problem, param="input")
        prompt = prompt_tokens(payload, state.config.chars_per_token)
        limit = state.config.context_limit
        if asks_for_summary(payload):
            step: JSON = {"kind": "ok", "content": f"<summary>SUMMARY of {prompt} tokens</summary>"}
        else:
            step = {"kind": "ok"} if limit is not None and prompt > limit else behaviour()
        limit = int(step["limit"]) if step.get("kind") == "context_limit" else limit
        if limit is not None and prompt > limit:
            return openai_error(400, RESPONSES_CONTEXT_MESSAGE, "context_length_exceeded", "input")
        if step.get("kind") == "error":
            return web.json_response(step.get("body", {}), status=int(step.get("status", 500)))
        stream = payload.get("stream") is True
        if step.get("kind") == "stream_error_event" and stream:
            return await _sse(
                request,
                [
                    _frame(
                        "error",
                        {
                            "type": "error",
                            "code": "context_length_exceeded",
                            "message": RESPONSES_CONTEXT_MESSAGE,
                            "param": "input",
                            "sequence_number": 0,
                        },
                    )
                ],
            )
        body = responses_body(payload, _expanded(payload, step), prompt)
        frames = [
            _frame(event["type"], {**event, "sequence_number": n})
            for n, event in enumerate(responses_events(body))
        ]
        if step.get("kind") in MALFORMED:
            return await malformed(request, step["kind"], stream, frames, orjson.dumps(body))
        if not stream:
            return web.json_response(body, headers={"x-request-id": "req_fake"})
        if step.get("kind") == "drop_mid_stream":  # the connection closes after a few events
            return await _sse(request, frames[: int(step.get("after_chunks", 2))], drop=True)
        if step.get("kind") == "slow_stream":
            return await _sse(request, frames, interval=float(step.get("interval", 0.2)))
        return await _sse(request, frames)

    async def compact(request: web.Request) -> web.Response:
        if not state.config.remote_compaction:
            return openai_error(404, "Not Found", "not_found")
        payload = await _payload(request)
        if payload is None:
            return openai_error(400, "We could not parse the JSON body of your request.")
        unreadable = compaction_problem(payload)
        if unreadable is not None:
            return openai_error(400, unreadable, "invalid_encrypted_content", "input")
        encrypted = f"gAAAAfakecompaction{next(_ids)}" + "y" * 16
        ISSUED.compactions.add(encrypted)
        items = payload.get("input")
        kept = [
            item
            for item in (items if isinstance(items, list) else [])
            if isinstance(item, dict) and item.get("role") == "user"
        ]
        prompt = prompt_tokens(payload, state.config.chars_per_token)
        item = {"type": "compaction", "id": f"cmp_{next(_ids)}", "encrypted_content": encrypted}
        return web.json_response(
            {
                "id": f"resp_{next(_ids)}",
                "object": "response.compaction",
                "created_at": 1_700_000_000,
                "output": [*kept, item],
                "usage": {
                    "input_tokens": prompt,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 50,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": prompt + 50,
                },
            },
            headers={"x-request-id": "req_fake"},
        )

    async def messages(request: web.Request) -> web.StreamResponse:
        payload = await _payload(request)
        if payload is None:
            return anthropic_error(400, "There was an issue with the JSON body of your request.")
        if not isinstance(payload.get("max_tokens"), int):
            return anthropic_error(400, "max_tokens: Field required")
        problem = messages_problem(payload)
        if problem is not None:
            return anthropic_error(400, problem)
        prompt = prompt_tokens(payload, state.config.chars_per_token)
        limit = state.config.context_limit
        if asks_for_summary(payload):
            step = {
                "kind": "ok",
                "content": f"<analysis>.</analysis><summary>SUMMARY of {prompt} tokens</summary>",
            }
        else:
            step = {"kind": "ok"} if limit is not None and prompt > limit else behaviour()
        limit = int(step["limit"]) if step.get("kind") == "context_limit" else limit
        if limit is not None and prompt > limit:
            return anthropic_error(400, f"prompt is too long: {prompt} tokens > {limit} maximum")
        if step.get("kind") == "error":
            return web.json_response(step.get("body", {}), status=int(step.get("status", 500)))
        stream = payload.get("stream") is True
        if step.get("kind") == "stream_error_event" and stream:
            error = {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": f"prompt is too long: {prompt} tokens > {max(1, prompt - 1)} maximum",
                },
            }
            return await _sse(request, [_frame("error", error)])
        body = messages_body(payload, _expanded(payload, step), prompt)
        if step.get("kind") in MALFORMED:
            frames = [_frame(name, data) for name, data in messages_events(body)]
            return await malformed(request, step["kind"], stream, frames, orjson.dumps(body))
        if not stream:
            return web.json_response(body, headers={"request-id": "req_fake"})
        return await _sse(request, [_frame(name, data) for name, data in messages_events(body)])

    async def count_tokens(request: web.Request) -> web.Response:
        payload = await _payload(request)
        if payload is None:
            return anthropic_error(400, "There was an issue with the JSON body of your request.")
        return web.json_response(
            {"input_tokens": prompt_tokens(payload, state.config.chars_per_token)}
        )

    app.router.add_post("/v1/responses", tracked(state, responses))
    app.router.add_post("/v1/responses/compact", compact)
    app.router.add_post("/v1/messages", tracked(state, messages))
    app.router.add_post("/v1/messages/count_tokens", count_tokens)


MALFORMED = frozenset({"not_json", "truncated", "bad_framing", "no_final", "hang"})
NOT_JSON = b"<html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>\n"


async def malformed(
    request: web.Request, kind: str, stream: bool, frames: list[bytes], whole: bytes
) -> web.StreamResponse:
    """A 200 that is not the API's answer, as broken proxies and servers send them (`frames`:
    the stream's events, `whole` the JSON body, of the answer this would have been):

        not_json     an HTML page (with the API's content type)
        truncated    half of the JSON body; a stream cut inside an event, then ended cleanly
        bad_framing  a stream whose second half of events lost their `data:` / `event:` field
                     names; the whole body sent as one SSE event
        no_final     a stream without its last event (`[DONE]`, `response.completed`,
                     `message_stop`); the whole body as it should be
        hang         nothing, ever (the handler sleeps)
    """
    if kind == "hang":
        await asyncio.sleep(3600)
    if kind == "not_json":
        out = [NOT_JSON]
    elif kind == "truncated":
        half = len(frames) // 2
        out = (
            [*frames[:half], frames[half][: len(frames[half]) // 2]]
            if stream
            else [whole[: len(whole) // 2]]
        )
    elif kind == "bad_framing":
        half = len(frames) // 2
        broken = [re.sub(rb"(?m)^(data|event): ?", b"", f) for f in frames[half:]]
        out = [*frames[:half], *broken] if stream else [b"data: " + whole + b"\n\n"]
    else:  # no_final
        out = frames[:-1] if stream else [whole]
    kind_of = "text/event-stream" if stream else "application/json"
    response = web.StreamResponse(status=200, headers={"Content-Type": kind_of})
    await response.prepare(request)
    for part in out:
        await response.write(part)
        await asyncio.sleep(0.005 if stream else 0)  # events arrive one by one, as upstreams send
    await response.write_eof()
    return response


async def _sse(
    request: web.Request, frames: list[bytes], interval: float = 0.0, drop: bool = False
) -> web.StreamResponse:
    """`frames` as an event stream, `interval` seconds apart; with `drop`, the connection is
    then closed without ending the stream."""
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "request-id": "req_fake",
            "x-request-id": "req_fake",
        }
    )
    await response.prepare(request)
    for frame in frames:
        await response.write(frame)
        await asyncio.sleep(interval)
    if drop and request.transport is not None:
        request.transport.close()
        return response
    await response.write_eof()
    return response
