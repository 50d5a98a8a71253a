"""Reading a client's body (design D9.1): the JSON object, the fields every API shares (`model`,
`stream`, the output maximum, counts within limits) and our message extension.

Our message extension (`"compactgate": {"pin", "priority", "type"}`) is read into `Marks` here
and stripped before forwarding, on every API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import InvalidRequestError

EXTENSION = "compactgate"
KINDS = frozenset({"message", "code", "plan_ref", "log", "other"})


@dataclass(frozen=True, slots=True)
class Marks:
    pin: bool = False
    priority: int | None = None
    kind: str | None = None


NO_MARKS = Marks()


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
