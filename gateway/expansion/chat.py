"""Internal tool rounds on Chat Completions: the gateway answers the model's calls to its own
expansion tools.

When a forwarded request had tool outputs masked, it also carries the gateway's read/grep tools
(`tool_outputs`). If the model calls them, the gateway runs them, appends the calls and their
results to the request and asks the model again, at most `max_rounds` times, so the client only
ever sees calls to its own tools and the final answer.

- Non-streaming: the answer is parsed; internal calls are resolved; the client's `usage` is the
  sum over all rounds.
- Streaming: the stream is read until it shows what it is. A stream that begins with an
  internal tool call is held back, read to the end, resolved, and the question asked again; a
  stream that begins with content or a call to a client tool is relayed at once (what has been
  read so far first). Usage of internal rounds is not added to a streamed answer's usage chunk.
- A response that mixes internal and client tool calls: the internal ones are resolved and the
  model asked again (it will repeat the client calls it still needs); the client calls of that
  round are not shown to the client.
- After `max_rounds`, internal calls left in the answer are removed from it.

Expanded text is appended after the compacted history and never goes through the policy chain
again, so it is never masked again in the same request and never becomes a new ref.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..ops.metrics import Metrics
from ..routing import Route
from ..tool_outputs import ToolOutputCache
from ..upstream import UpstreamClient, UpstreamResponse
from ..upstream.retry import send_with_retries
from .rounds import Call
from .whole import Whole


def applicable(payload: Mapping[str, Any], names: frozenset[str]) -> bool:
    """Whether the expansion tools can be offered on this request."""
    if payload.get("functions") is not None or payload.get("tool_choice") == "none":
        return False
    for tool in payload.get("tools") or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") in names:
            return False  # the client has a tool of that name: never shadow it
    return True


def with_tools(payload: dict[str, Any], cache: ToolOutputCache) -> dict[str, Any]:
    """The payload plus the expansion tools and one system line saying how to use them."""
    messages = list(payload["messages"])
    head = 0
    while head < len(messages) and messages[head].get("role") in ("system", "developer"):
        head += 1
    messages.insert(head, {"role": "system", "content": cache.system_note()})
    return {
        **payload,
        "messages": messages,
        "tools": [*(payload.get("tools") or []), *cache.tool_definitions()],
    }


class ChatExpansion:
    """Internal rounds of a streamed chat answer (a whole one goes through `whole.resolve`)."""

    def __init__(self, cache: ToolOutputCache, upstream: UpstreamClient, metrics: Metrics) -> None:
        self.cache = cache
        self.upstream = upstream
        self.metrics = metrics

    async def resolve_stream(
        self,
        response: UpstreamResponse,
        first: bytes,
        sent: bytes,
        route: Route,
        url: str,
        headers: Mapping[str, str],
        tenant: str,
    ) -> tuple[UpstreamResponse, bytes, int]:
        """Streaming: returns the response to relay, the bytes already read from it, and rounds."""
        names = self.cache.names
        payload: dict[str, Any] | None = None
        rounds = 0
        while True:
            reader = _StreamReader(names)
            if first:
                reader.feed(first)
                first = b""
            if reader.verdict == "undecided":
                async for chunk in response.chunks():
                    if reader.feed(chunk) != "undecided":
                        break
            if reader.verdict != "internal" or rounds >= self.cache.config.max_rounds:
                return response, reader.buffered, rounds
            async for chunk in response.chunks():
                reader.feed(chunk)
            response.close()
            if payload is None:
                payload = orjson.loads(sent)
            content, calls = reader.message()
            internal = _internal(calls, names)
            results = [
                await self.cache.execute(tenant, call.name, call.arguments)
                for call in map(_call, internal)
            ]
            payload = _appended(payload, content or None, internal, results)
            rounds += 1
            self.metrics.internal_tool_rounds.labels(self.metrics.model_label(route.name)).inc()
            response = await send_with_retries(
                self.upstream, route, url, headers, orjson.dumps(payload), self.metrics
            )
            if response.status >= 400:
                return response, b"", rounds


# -- a whole answer (`whole.resolve`) ------------------------------------------------------------


def internal_calls(message: Mapping[str, Any], names: frozenset[str]) -> list[Call]:
    return [_call(c) for c in _internal(message.get("tool_calls") or (), names)]


def next_payload(
    payload: dict[str, Any],
    message: Mapping[str, Any],
    calls: Sequence[Call],
    results: Sequence[str],
    names: frozenset[str],
) -> dict[str, Any]:
    internal = _internal(message.get("tool_calls") or (), names)
    return _appended(payload, message.get("content"), internal, results)


def finish(answer: dict[str, Any], names: frozenset[str], usages: Sequence[Any]) -> bytes:
    """Internal calls left after the last round removed; usage: every round's, added up."""
    message = _message(answer)
    calls = message.get("tool_calls") or []
    if _internal(calls, names):
        kept = [c for c in calls if c not in _internal(calls, names)]
        if kept:
            message["tool_calls"] = kept
        else:
            message.pop("tool_calls", None)
            if answer.get("choices"):
                answer["choices"][0]["finish_reason"] = "stop"
    usage = None
    for more in usages:
        usage = _add_usage(usage, dict(more) if isinstance(more, dict) else None)
    if usage is not None:
        answer["usage"] = usage
    return orjson.dumps(answer)


def _internal(calls: Sequence[Any], names: frozenset[str]) -> list[dict[str, Any]]:
    return [
        c
        for c in calls
        if isinstance(c, dict)
        and isinstance(c.get("function"), dict)
        and c["function"].get("name") in names
    ]


def _call(call: dict[str, Any]) -> Call:
    function = call["function"]
    return Call(call.get("id", ""), function.get("name", ""), function.get("arguments") or "")


def _appended(
    payload: dict[str, Any], content: Any, calls: list[dict[str, Any]], results: Sequence[str]
) -> dict[str, Any]:
    """The history, the assistant's internal calls and a tool message with each result."""
    answered = [
        {"role": "tool", "tool_call_id": call.get("id", ""), "content": result}
        for call, result in zip(calls, results, strict=True)
    ]
    return {
        **payload,
        "messages": [
            *payload["messages"],
            {"role": "assistant", "content": content, "tool_calls": calls},
            *answered,
        ],
    }


class _StreamReader:
    """Reads SSE events far enough to tell an internal tool call from anything else."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.buffered = b""
        self._pending = b""
        self.verdict = "undecided"  # undecided | internal | relay
        self._content: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}

    def feed(self, chunk: bytes) -> str:
        self.buffered += chunk
        data = self._pending + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return self.verdict
        complete, self._pending = data[: end + 2], data[end + 2 :]
        for event in complete.split(b"\n\n"):
            event = event.strip()
            if not event.startswith(b"data:") or event == b"data: [DONE]":
                continue
            try:
                chunk_json = orjson.loads(event[5:])
            except orjson.JSONDecodeError:
                self._decide("relay")
                continue
            self._read(chunk_json)
        return self.verdict

    def _decide(self, verdict: str) -> None:
        if self.verdict == "undecided":
            self.verdict = verdict

    def _read(self, chunk: Any) -> None:
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not choices:
            if isinstance(chunk, dict) and "error" in chunk:
                self._decide("relay")
            return
        delta = choices[0].get("delta") or {}
        if delta.get("content"):
            self._content.append(delta["content"])
            self._decide("relay")
        for call in delta.get("tool_calls") or ():
            slot = self._calls.setdefault(
                call.get("index", 0),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if call.get("id"):
                slot["id"] = call["id"]
            function = call.get("function") or {}
            if function.get("name"):
                slot["function"]["name"] += function["name"]
                self._decide("internal" if slot["function"]["name"] in self.names else "relay")
            if function.get("arguments"):
                slot["function"]["arguments"] += function["arguments"]
        if choices[0].get("finish_reason"):
            self._decide("relay")

    def message(self) -> tuple[str, list[dict[str, Any]]]:
        return "".join(self._content), [self._calls[i] for i in sorted(self._calls)]


def _message(answer: Mapping[str, Any]) -> dict[str, Any]:
    choices = answer.get("choices") or [{}]
    return choices[0].get("message") or {}


def _add_usage(total: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    if total is None or more is None:
        return total or more
    out = dict(total)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if isinstance(out.get(key), int) and isinstance(more.get(key), int):
            out[key] = out[key] + more[key]
    return out


WHOLE = Whole(_message, internal_calls, next_payload, finish)
