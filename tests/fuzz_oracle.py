"""What every answer to hostile input must be (design D15.3), for the fuzz tests of every layer.

- Never a 5xx: the gateway's own errors for client input are 4xx, and the fake upstream never
  answers with a 5xx unless a test scripts it.
- A 4xx is in the client API's own error shape: OpenAI's `{"error": {message, type, param,
  code}}` on chat, Responses and compact; Anthropic's `{"type": "error", "error": {type,
  message}}` on Messages and count_tokens.
- A 2xx is that API's answer: its JSON, or its stream to the last event.
- Upstream: every request of the example (the client's own header `x-fuzz-example` marks them;
  the gateway's own summary calls carry no client header) is a JSON object that the gateway's own
  parser for its path accepts: nothing unparseable or half-parsed reaches it. A request the
  gateway refused itself sent nothing at all (but a context error found only after the
  upstream's own refusal).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.summaries.transcript import SYSTEM_PROMPT
from gateway.wire import CHAT, COUNT_TOKENS, MESSAGES, RESPONSES, Wire
from gateway.wire.usage import sse_events

MARK = "x-fuzz-example"
PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "count_tokens": "/v1/messages/count_tokens",
    "compact": "/v1/responses/compact",
}
ANTHROPIC_SHAPED = frozenset({"messages", "count_tokens"})
PARSERS: dict[str, Wire] = {
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESPONSES,
    "/v1/responses/compact": RESPONSES,
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": COUNT_TOKENS,
}
TERMINAL = {
    "chat": None,  # `data: [DONE]`
    "responses": {"response.completed", "response.failed", "response.incomplete", "error"},
    "messages": {"message_stop", "error"},
}


def error_problems(api: str, body: bytes) -> list[str]:
    """How `body` is not an error in `api`'s shape."""
    document = _json(body)
    if not isinstance(document, dict):
        return [f"error body is not a JSON object: {body[:200]!r}"]
    error = document.get("error")
    if not isinstance(error, dict):
        return [f"no error object: {body[:200]!r}"]
    problems = []
    if not isinstance(error.get("message"), str) or not error["message"]:
        problems.append(f"no message: {error}")
    if not isinstance(error.get("type"), str):
        problems.append(f"no type: {error}")
    if api in ANTHROPIC_SHAPED:
        if document.get("type") != "error":
            problems.append(f"not Anthropic's envelope: {body[:200]!r}")
    else:
        if not {"message", "type", "param", "code"} <= set(error):
            problems.append(f"not OpenAI's error fields: {error}")
        for key in ("param", "code"):
            if error.get(key) is not None and not isinstance(error[key], str | int):
                problems.append(f"{key} is {error[key]!r}")
    return problems


def answer_problems(
    api: str, status: int, headers: Mapping[str, str], body: bytes, relayed: bool
) -> list[str]:
    """How an HTTP answer breaks the rules above (`relayed`: the upstream's own answer)."""
    if status >= 500:
        return [f"{status} for client input: {body[:500]!r}"]
    if status >= 400:
        return error_problems(api, body)
    if not 200 <= status < 300:
        return [f"status {status}"]
    if headers.get("content-type", "").startswith("text/event-stream"):
        return stream_problems(api, body)
    document = _json(body)
    if not isinstance(document, dict):
        return [f"a 2xx that is not a JSON object: {body[:200]!r}"]
    expected = {
        "chat": "choices",
        "responses": "output",
        "compact": "output",
        "messages": "content",
        "count_tokens": "input_tokens",
    }[api]
    return [] if expected in document else [f"a 2xx without `{expected}`: {body[:300]!r}"]


def stream_problems(api: str, body: bytes) -> list[str]:
    """How a streamed 2xx is not `api`'s stream to its last event."""
    events = list(sse_events(body))
    if not events:
        return [f"an empty stream: {body[:200]!r}"]
    last_name, last = events[-1]
    if api == "chat":
        return [] if last == b"[DONE]" else [f"chat stream without [DONE]: {body[-300:]!r}"]
    document = _json(last)
    kind = document.get("type") if isinstance(document, dict) else last_name.decode()
    if kind not in TERMINAL.get(api, ()):
        return [f"{api} stream ends with {kind!r}: {body[-300:]!r}"]
    if api == "responses":
        numbers = [d.get("sequence_number") for _, d in _documents(events)]
        numbers = [n for n in numbers if isinstance(n, int)]
        if numbers != list(range(numbers[0], numbers[0] + len(numbers))) if numbers else False:
            return [f"sequence numbers {numbers}"]
    return []


def socket_problems(frames: list[dict[str, Any]]) -> list[str]:
    """How the frames of one answer on the Responses WebSocket break the rules."""
    if not frames:
        return ["no frame"]
    last = frames[-1]
    problems = []
    if last.get("type") == "error":
        status = last.get("status")
        if not isinstance(status, int) or not 400 <= status < 500:
            problems.append(f"error frame with status {status}: {last}")
        error = last.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            problems.append(f"error frame without an error: {last}")
    elif last.get("type") == "response.failed":
        problems.append(f"failed: {last}")
    numbers = [
        f.get("sequence_number") for f in frames if isinstance(f.get("sequence_number"), int)
    ]
    if numbers and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        problems.append(f"sequence numbers {numbers}")
    return problems


def upstream_problems(
    records: Iterable[Mapping[str, Any]], example: str, refused: bool
) -> list[str]:
    """How what the upstream received breaks the rules above. `refused`: the gateway answered
    the example with its own error before any upstream call could be made."""
    problems = []
    for record in records:
        raw = base64.b64decode(record["body_b64"])
        if record["method"] == "POST" and not isinstance(_json(raw), dict):
            problems.append(
                f"{record['path']} received a body that is not a JSON object: {raw[:200]!r}"
            )
            continue
        mine = any(k.lower() == MARK and v == example for k, v in record["headers"])
        if not mine:
            continue
        if refused:
            problems.append(f"refused, yet {record['path']} received {raw[:200]!r}")
            continue
        wire = PARSERS.get(record["path"])
        if wire is not None:
            try:
                wire.parse(raw, 10**6)
            except GatewayError as error:
                problems.append(
                    f"{record['path']} received what no client may send ({error.message}): {raw[:300]!r}"
                )
    return problems


def summary_call(body: Any) -> bool:
    """Whether a chat body the upstream received is the gateway's own summariser call."""
    messages = body.get("messages") if isinstance(body, dict) else None
    first = messages[0] if isinstance(messages, list) and messages else None
    return isinstance(first, dict) and first.get("content") == SYSTEM_PROMPT


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _documents(events: list[tuple[bytes, bytes]]) -> Iterable[tuple[bytes, dict[str, Any]]]:
    for name, data in events:
        document = _json(data)
        if isinstance(document, dict):
            yield name, document
