"""What a wire adapter does for the request path, and the request it hands it.

An adapter owns one client API end to end: it parses a body into the canonical conversation
(`WireRequest`), renders a compacted conversation back (untouched items exactly as sent), counts
what is not a message (tool definitions), shapes the gateway's own errors the way that API's
clients parse them, recognises a stream that opens with a context-window error, and reads the
usage the upstream reports. The request path never looks inside a body itself.

The policies work on one canonical conversation: OpenAI-chat-shaped message dicts (`role`,
`content`, `tool_calls`, `tool_call_id`). Each adapter parses its API's body into that form and
keeps, in `layout`, where every canonical message came from, so that it can render the
compacted conversation back into its own API with every untouched item exactly as it was sent.
Fields the adapter does not own stay in `payload` and are forwarded as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import GatewayError
from .context_errors import ContextError, classify
from .fields import Marks, serialise
from .usage import Usage, UsageTap, json_or_none, sse_events

if TYPE_CHECKING:
    from policies import Message

    from ..counting.tokens import MessageCounter
    from .resent import ResentScope


class Wire:
    """The base adapter: what differs per API is overridden, the rest is shared."""

    name: ClassVar[str]
    # A stream reports its usage only when the client asks (`stream_options.include_usage`):
    # the gateway may ask for it on the client's behalf (`server.stream_usage: inject`).
    asks_stream_usage: ClassVar[bool] = False
    upstream_path: ClassVar[str]  # appended to the upstream's base_url
    answer_field: ClassVar[str]  # every whole answer of this API has it (`framing`)
    conversation_field: ClassVar[str] = "messages"  # the body's field holding the history

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


@dataclass(frozen=True, slots=True)
class WireRequest:
    """A validated request of one wire API, with its canonical conversation."""

    wire: Wire  # the adapter that parsed it, and renders it back
    body: bytes  # exactly as received
    payload: dict[str, Any]  # the parsed body, as sent
    model: str
    stream: bool
    messages: list[dict[str, Any]]  # canonical messages, our extension stripped
    marks: list[Marks]
    has_extension: bool
    max_output: int | None  # the output limit the client asked for
    include_usage: bool = True  # chat: stream_options.include_usage; always for the others
    layout: Any = None  # the adapter's map from canonical messages back to its items
    # The history lives upstream (`previous_response_id`, `conversation`): the gateway sees
    # only the new items and forwards the request as it is.
    stateful: bool = False

    @property
    def api(self) -> str:
        return self.wire.name

    def with_max_output(self, value: int) -> WireRequest:
        """The same request asking for at most `value` output tokens (clamp_max_tokens)."""
        key = self.wire.max_output_field(self.payload)
        payload = {**self.payload, key: value}
        return replace(self, payload=payload, body=serialise(payload), max_output=value)

    def forward_payload(
        self,
        messages: Sequence[Message] | None,
        model: str | None,
        inject_usage: bool = False,
        uids: Sequence[int | None] = (),
    ) -> dict[str, Any]:
        """The payload to forward: the client's, with the compacted conversation (None: the
        client's own) and the upstream's model name when given. `uids`: those the prefix memo
        gave the client's messages, when known (see `unchanged`)."""
        return self.wire.render(self, messages, model, inject_usage, uids)


def unchanged(
    messages: Sequence[Message], originals: Sequence[Any], uids: Sequence[int | None]
) -> list[bool]:
    """For each of `messages`, whether it is the client's message it came from (`originals`,
    by `origin`), as sent; False for a message a step made.

    Equal uids mean equal data (`gateway.counting.prefix`), and a step that changes a message
    drops its uid: a kept message whose uid is the client message's own is known unchanged without
    comparing the two (a held result's messages are the previous request's equal objects, and
    comparing a long agent history costs as much as rendering it).
    """
    if len(uids) != len(originals):
        uids = [None] * len(originals)
    return [
        m.origin >= 0
        and (
            m.data is originals[m.origin]
            or (m.uid is not None and m.uid == uids[m.origin])
            or m.data == originals[m.origin]
        )
        for m in messages
    ]
