"""The checks the resumed-parse tests share: a request parsed by resuming the conversation's
previous parse is the request a parse from scratch gives, and is forwarded alike."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from gateway.devtools.parts import Parts
from gateway.errors import ContextLengthExceededError, InvalidRequestError
from gateway.wire import Wire
from gateway.wire.base import WireRequest


def same_messages(resumed: WireRequest, fresh: WireRequest) -> None:
    """The two parses give the same canonical messages (key order and number types included),
    marks and extension flag; each API's test compares its own layout besides."""
    assert orjson.dumps(resumed.messages) == orjson.dumps(fresh.messages)
    assert resumed.marks == fresh.marks
    assert resumed.has_extension == fresh.has_extension


async def resumed_as_fresh(
    memo: Parts,
    scratch: Parts,
    wire: Wire,
    sent: bytes,
    tenant: str,
    window: int,
    same_request: Callable[[WireRequest, WireRequest], None],
) -> None:
    """`memo` (which has seen the conversation) and a parse from scratch give the same 400, or
    requests `same_request` finds equal; `scratch` (a gateway with the same ref secret) and
    `memo` then give the same context error or forward the same body."""
    route = memo.router.resolve("m")
    assert route is not None
    try:
        fresh = wire.parse(sent, 10_000)
    except InvalidRequestError as error:  # (an edit may break a tool call and its result)
        with pytest.raises(InvalidRequestError) as raised:
            memo.parse(wire, sent, tenant)
        assert raised.value.message == error.message
        return
    resumed = memo.parse(wire, sent, tenant)
    same_request(resumed, fresh)
    try:
        expected = await scratch.engine.prepare(fresh, route, tenant, window=window)
    except ContextLengthExceededError as error:  # (the newest turn alone is over the window)
        with pytest.raises(ContextLengthExceededError) as raised:
            await memo.engine.prepare(resumed, route, tenant, window=window)
        assert raised.value.message == error.message
        return
    forwarded = await memo.engine.prepare(resumed, route, tenant, window=window)
    assert forwarded.body == expected.body
