"""A client request as every wire adapter hands it to the pipeline.

The policies work on one canonical conversation: OpenAI-chat-shaped message dicts (`role`,
`content`, `tool_calls`, `tool_call_id`). Each adapter parses its API's body into that form and
keeps, in `layout`, where every canonical message came from, so that it can render the
compacted conversation back into its own API with every untouched item exactly as it was sent.
Fields the adapter does not own stay in `payload` and are forwarded as they are.

Our message extension (`"compactgate": {"pin", "priority", "type"}`) is read into `Marks` here
and stripped before forwarding, on every API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import InvalidRequestError

if TYPE_CHECKING:
    from policies import Message

    from .base import Wire

EXTENSION = "compactgate"
KINDS = frozenset({"message", "code", "plan_ref", "log", "other"})


@dataclass(frozen=True, slots=True)
class Marks:
    pin: bool = False
    priority: int | None = None
    kind: str | None = None


NO_MARKS = Marks()


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

    Equal uids mean equal data (`gateway.prefix`), and a step that changes a message drops its
    uid: a kept message whose uid is the client message's own is known unchanged without
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


def read_marks(value: Any, where: str) -> Marks:
    """The marks of one message's extension; a 400 naming the field when it is malformed."""
    where = f"{where}.{EXTENSION}"
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{where} must be an object.", param=where)
    unknown = set(value) - {"pin", "priority", "type"}
    if unknown:
        raise InvalidRequestError(
            f"{where} has unknown keys: {', '.join(sorted(unknown))}.", param=where
        )
    pin = value.get("pin", False)
    if not isinstance(pin, bool):
        raise InvalidRequestError(f"{where}.pin must be a boolean.", param=f"{where}.pin")
    priority = value.get("priority")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 3
    ):
        raise InvalidRequestError(f"{where}.priority must be 1, 2 or 3.", param=f"{where}.priority")
    kind = value.get("type")
    if kind is not None and (not isinstance(kind, str) or kind not in KINDS):
        raise InvalidRequestError(
            f"{where}.type must be one of {', '.join(sorted(KINDS))}.", param=f"{where}.type"
        )
    return Marks(pin=pin, priority=priority, kind=kind)


def serialise(value: Any) -> bytes:
    """`value` (made of a client's body) written as JSON again. orjson reads 1024 levels of
    nesting but writes fewer: a body between the two can only be refused once it has to be
    written again (an unchanged body is forwarded as its own bytes), as a 400 (design D15.3)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise InvalidRequestError(
            f"The request body cannot be forwarded once changed: {exc}."
        ) from None


def load_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying why not."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    return payload


def read_model(payload: Mapping[str, Any]) -> str:
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError(
            "`model` is required and must be a non-empty string.", param="model"
        )
    return model


def read_stream(payload: Mapping[str, Any]) -> bool:
    stream = payload.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise InvalidRequestError("`stream` must be a boolean.", param="stream")
    return stream


def read_positive(payload: Mapping[str, Any], *keys: str) -> int | None:
    """The first of `keys` present, which must be a positive integer."""
    for key in keys:
        value = payload.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequestError(f"`{key}` must be a positive integer.", param=key)
        return value
    return None


def check_count(count: int, limit: int, field: str) -> None:
    if count > limit:
        raise InvalidRequestError(
            f"`{field}` has {count} items; this gateway accepts at most {limit}.", param=field
        )


def check_tools(payload: Mapping[str, Any], *keys: str) -> None:
    for key in keys:
        value = payload.get(key)
        if value is not None and not (
            isinstance(value, list) and all(isinstance(t, dict) for t in value)
        ):
            raise InvalidRequestError(f"`{key}` must be an array of objects.", param=key)
