"""What a wire adapter does for the request path, and what every adapter shares.

An adapter owns one client API end to end: it parses a body into the canonical conversation
(`WireRequest`), renders a compacted conversation back (untouched items exactly as sent), counts
what is not a message (tool definitions), shapes the gateway's own errors the way that API's
clients parse them, recognises a stream that opens with a context-window error, and reads the
usage the upstream reports. The request path in `app.py` never looks inside a body itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from ..context_errors import ContextError, classify
from ..errors import GatewayError
from .request import WireRequest

if TYPE_CHECKING:
    from policies import Message

    from ..tokens import MessageCounter
    from .resent import ResentScope


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


class UsageTap:
    """Watches a relayed stream for the usage it reports (bytes pass through untouched)."""

    def __init__(self, wire: Wire) -> None:
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


class Wire:
    """The base adapter: what differs per API is overridden, the rest is shared."""

    name: ClassVar[str]
    upstream_path: ClassVar[str]  # appended to the upstream's base_url
    answer_field: ClassVar[str]  # every whole answer of this API has it (`framing`)

    def parse(
        self, body: bytes, max_messages: int, resent: ResentScope | None = None
    ) -> WireRequest:
        """The body as a request of this API (a 400 when it is not one). `resent`: the tenant's
        memo of previous parses, for an adapter whose parse is worth resuming."""
        raise NotImplementedError

    def render(
        self,
        request: WireRequest,
        messages: Sequence[Message] | None,
        model: str | None,
        inject_usage: bool,
        uids: Sequence[int | None] = (),
    ) -> dict[str, Any]:
        """The payload to forward: the client's, with `messages` (None: the client's own
        conversation) and `model`. `uids`: those of the client's messages (`unchanged`)."""
        raise NotImplementedError

    def max_output_field(self, payload: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def tools_tokens(self, request: WireRequest, counter: MessageCounter) -> int:
        """Tokens the request's tool definitions add to the prompt."""
        raise NotImplementedError

    # -- errors ------------------------------------------------------------------------------

    def error_body(self, error: GatewayError) -> bytes:
        """The gateway's own error, in this API's shape (OpenAI's unless overridden)."""
        return error.body()

    def stream_error_event(self, error: GatewayError, sequence: int = 0) -> bytes:
        """The gateway's own error as the last event of a stream already under way;
        `sequence` is the number it must carry where events are numbered (Responses)."""
        return b"data: " + error.body() + b"\n\n"

    def final_event(self, name: bytes, data: bytes, document: Any) -> bool:
        """Whether a stream event (its `event:` name, its data, that data parsed) is the last
        one of an answer of this API (`framing.StreamCheck`)."""
        raise NotImplementedError

    def head_decided(self, head: bytes) -> bool:
        """Whether the start of a stream read so far shows what it is: an answer, or an error
        event that may be a context overflow. Chat streams show it in their first chunk."""
        return bool(head)

    def stream_context_error(self, first: bytes) -> ContextError | None:
        """A 200 stream that opens with an error event may be a context overflow."""
        if not first:
            # llama-cpp-python answers an overflowing streaming request with an empty 200 body.
            return ContextError(signature="empty_stream", limit=None, requested=None)
        head = first.lstrip()
        if b'"error"' not in head[:4096]:
            return None
        for _, data in sse_events(head[:4096]):
            found = classify(400, data)
            if found is not None:
                return found
        return None

    # -- usage -------------------------------------------------------------------------------

    def usage(self, body: bytes) -> Usage | None:
        """The usage of a non-streaming answer."""
        if b'"usage"' not in body:
            return None
        document = json_or_none(body)
        return self.usage_of(document) if isinstance(document, dict) else None

    def usage_of(self, document: Mapping[str, Any]) -> Usage | None:
        raise NotImplementedError

    def stream_usage(self, name: bytes, data: bytes, known: Usage | None) -> Usage | None:
        """The usage one stream event reports (None: it reports none)."""
        document = json_or_none(data)
        return self.usage_of(document) if isinstance(document, dict) else None

    def usage_tap(self) -> UsageTap:
        return UsageTap(self)

    # -- the gateway's own calls (summaries) -------------------------------------------------

    def plain_request(
        self, model: str, system: str, prompt: str, limit: int | None, limit_field: str
    ) -> dict[str, Any]:
        """A one-shot request in this API: a system prompt, one user message, no tools."""
        raise NotImplementedError

    def answer_text(self, document: Mapping[str, Any]) -> str | None:
        """The text of a non-streaming answer; None when it is not this API's answer."""
        raise NotImplementedError

    # -- headers -----------------------------------------------------------------------------

    def credential_headers(self, api_key: str) -> dict[str, str]:
        """How a gateway-held key is sent to this API's upstream."""
        return {"authorization": f"Bearer {api_key}"}


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
