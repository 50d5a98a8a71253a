"""A Messages request parsed by resuming the conversation's previous parse is exactly a request
parsed from scratch, and is forwarded byte for byte the same.

The requests of a generated agent session are sent in a generated order, each perhaps edited
the way clients and people do (a block's text changed, the history cut short or reordered, a
message's keys in another order, a number written as a float or a boolean, our extension
added), by two tenants. One gateway parses each with its memo of previous parses (as its
endpoint does), another from scratch; both run the whole pipeline on it.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.app import Gateway
from gateway.config import parse_config
from gateway.errors import InvalidRequestError
from gateway.wire import MESSAGES
from gateway.wire.request import WireRequest
from tests.wire_strategies import messages_bodies

WINDOWS = (1_200, 100_000)  # compacted (a held result on later turns), and as sent
EDITS = ("none", "text", "keys", "number", "extension", "reorder")


def _gateway() -> Gateway:
    model = {
        "name": "m",
        "upstream": {"base_url": "http://127.0.0.1:9/v1"},
        "tokenizer": "chars:4",
        "context_window": WINDOWS[0],
        "max_output_tokens": 100,
        "policy": "p",
    }
    policy = {"trigger_ratio": 0.8, "target_ratio": 0.5}
    return Gateway(parse_config({"models": [model], "policies": {"p": policy}}))


def _edited(messages: list[Any], edit: str, at: int, other: int) -> list[Any]:
    """`messages` with one edit made at message `at` (a deep copy: the session stays as drawn)."""
    messages = copy.deepcopy(messages)
    if not messages or edit == "none":
        return messages
    at, other = at % len(messages), other % len(messages)
    message = messages[at]
    blocks = message["content"] if isinstance(message["content"], list) else []
    if edit == "text":
        if blocks:
            blocks[0] = {**blocks[0], "text": "edited"}  # a new field on a non-text block
        else:
            message["content"] += " (edited)"
    elif edit == "keys":  # the same values, keys in reverse order: equal dicts, other JSON
        messages[at] = {k: message[k] for k in reversed(message)}
        messages[at]["content"] = [{k: b[k] for k in reversed(b)} for b in blocks] or (
            message["content"]
        )
    elif edit == "number":  # `1` and `1.0` and `True` are equal in Python, not in JSON
        for block in blocks:
            if block.get("type") == "tool_use":
                n = block["input"]["n"]
                block["input"] = {"n": True if n == 1 else float(n)}
    elif edit == "extension":
        message["compactgate"] = {"pin": True}
    elif edit == "reorder":
        messages[at], messages[other] = messages[other], messages[at]
    return messages


def _same_request(resumed: WireRequest, fresh: WireRequest) -> None:
    """The two parses are the same data, key order and number types included."""
    assert orjson.dumps(resumed.messages) == orjson.dumps(fresh.messages)
    assert resumed.marks == fresh.marks
    assert resumed.has_extension == fresh.has_extension
    old, new = resumed.layout, fresh.layout
    assert orjson.dumps(old.messages) == orjson.dumps(new.messages)
    assert (old.spans, old.parts, old.marked, old.markers) == (
        new.spans,
        new.parts,
        new.marked,
        new.markers,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages_bodies(),
    st.lists(
        st.tuples(
            st.floats(0, 1),  # how much of the session the request holds
            st.sampled_from(EDITS),
            st.integers(0, 50),
            st.integers(0, 50),
            st.sampled_from(("a", "b")),
            st.sampled_from(WINDOWS),
        ),
        min_size=2,
        max_size=8,
    ),
)
async def test_a_resumed_parse_forwards_exactly_what_a_parse_from_scratch_does(
    body: dict[str, Any], requests: list[tuple[float, str, int, int, str, int]]
) -> None:
    memo, scratch = _gateway(), _gateway()
    scratch.pipeline.ref_secret = memo.pipeline.ref_secret  # the same refs for masked outputs
    route = memo.router.resolve("m")
    assert route is not None
    session = body["messages"]
    for share, edit, at, other, tenant, window in requests:
        end = max(1, round(share * len(session)))
        sent = orjson.dumps({**body, "messages": _edited(session[:end], edit, at, other)})
        try:
            fresh = MESSAGES.parse(sent, 10_000)
        except InvalidRequestError as error:  # (a reordered history may break a tool pair)
            with pytest.raises(InvalidRequestError) as raised:
                memo.parse(MESSAGES, sent, tenant)
            assert raised.value.message == error.message
            continue
        resumed = memo.parse(MESSAGES, sent, tenant)
        _same_request(resumed, fresh)
        expected = await scratch.pipeline.prepare(fresh, route, tenant, window=window)
        forwarded = await memo.pipeline.prepare(resumed, route, tenant, window=window)
        assert forwarded.body == expected.body


def test_a_conversation_is_resumed_only_for_its_own_tenant() -> None:
    """Tenant b sending the history tenant a sent gets objects of its own parse; tenant a's next
    request takes over tenant a's."""
    gw = _gateway()
    turn = {"role": "user", "content": [{"type": "text", "text": "Fix the tests."}]}
    answer = {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    first = orjson.dumps({"model": "m", "max_tokens": 10, "messages": [turn]})
    later = orjson.dumps({"model": "m", "max_tokens": 10, "messages": [turn, answer, turn]})
    a = gw.parse(MESSAGES, first, "a")
    b = gw.parse(MESSAGES, later, "b")
    again = gw.parse(MESSAGES, later, "a")
    assert b.messages[0] is not a.messages[0] and b.layout.messages[0] is not a.layout.messages[0]
    assert again.messages[0] is a.messages[0]
    assert gw.resent.reused == 1
