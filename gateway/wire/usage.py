"""What an upstream's answer says it cost (`Usage`), read from a whole body or a stream as it
passes (`UsageTap`), and the event-stream framing the adapters share.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson


@dataclass(frozen=True, slots=True)
class Usage:
    """What the upstream billed for one response, in one convention for every API.

    `input` is every prompt token, cached or not (OpenAI's `prompt_tokens`/`input_tokens`;
    Anthropic's `input_tokens` + cache reads + cache writes). The cache tiers are parts of it.
    """

    input: int
    output: int = 0
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
    reasoning: int = 0  # part of `output`


def sse_events(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(event name, data) of each complete SSE event in `data`; the name is b'' when absent."""
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        name = b""
        lines: list[bytes] = []
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip()
            elif line.startswith(b"data:"):
                lines.append(line[5:].lstrip(b" "))
        if lines:
            yield name, b"\n".join(lines)


def json_or_none(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


class StreamUsage(Protocol):
    """What a tap asks of its wire adapter (`base.Wire.stream_usage`)."""

    def stream_usage(self, name: bytes, data: bytes, known: Usage | None) -> Usage | None: ...


class UsageTap:
    """Watches a relayed stream for the usage it reports (bytes pass through untouched)."""

    def __init__(self, wire: StreamUsage) -> None:
        self._wire = wire
        self._pending = b""
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        data = self._pending + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return
        complete, self._pending = data[: end + 2], data[end + 2 :]
        if b"usage" not in complete:
            return
        for name, event in sse_events(complete):
            found = self._wire.stream_usage(name, event, self.usage)
            if found is not None:
                self.usage = found


def number(value: Any) -> int:
    """A usage field as an int (0 when absent or not a number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def openai_usage(usage: object, input_key: str, output_key: str) -> Usage | None:
    """OpenAI's usage object, under Chat Completions' or the Responses API's names for the two
    counts: cached tokens are a subset of the input, reasoning tokens of the output."""
    if not isinstance(usage, dict) or input_key not in usage:
        return None
    details = usage.get(f"{input_key}_details")
    output_details = usage.get(f"{output_key}_details")
    return Usage(
        input=number(usage.get(input_key)),
        output=number(usage.get(output_key)),
        cache_read=number(details.get("cached_tokens")) if isinstance(details, dict) else 0,
        reasoning=number(output_details.get("reasoning_tokens"))
        if isinstance(output_details, dict)
        else 0,
    )
