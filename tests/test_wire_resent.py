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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.devtools.parts import Parts, parts
from gateway.wire import MESSAGES
from gateway.wire.base import WireRequest
from policies import Message
from tests.configs import compacting
from tests.resume_checks import resumed_as_fresh, same_messages
from tests.wire_strategies import messages_bodies

WINDOWS = (600, 1_200, 100_000)  # compacted (a held result on later turns), and as sent
EDITS = ("none", "text", "keys", "number", "extension", "reorder")


def _gateway() -> Parts:
    return parts(parse_config(compacting()))


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
    same_messages(resumed, fresh)
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
            st.one_of(st.just("none"), st.sampled_from(EDITS)),  # half of them unedited
            st.integers(0, 50),
            st.integers(0, 50),
            st.sampled_from(("a", "b")),
        ),
        min_size=2,
        max_size=10,
    ),
    st.booleans(),
    st.sampled_from(WINDOWS),
)
async def test_a_resumed_parse_forwards_exactly_what_a_parse_from_scratch_does(
    body: dict[str, Any],
    requests: list[tuple[float, str, int, int, str]],
    in_order: bool,
    window: int,
) -> None:
    """`in_order`: the requests hold ever more of the session, as an agent's turns do (held
    results are then resent); else any part of it, in any order."""
    memo, scratch = _gateway(), _gateway()
    session = body["messages"]
    if in_order:
        requests = sorted(requests, key=lambda request: request[0])
    for share, edit, at, other, tenant in requests:
        end = max(1, round(share * len(session)))
        sent = orjson.dumps({**body, "messages": _edited(session[:end], edit, at, other)})
        await resumed_as_fresh(memo, scratch, MESSAGES, sent, tenant, window, _same_request)


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


async def test_an_agent_session_over_a_small_window_forwards_what_a_parse_from_scratch_does() -> (
    None
):
    """Claude Code's shape, turn after turn: a prompt-cache marker on the system and on the
    newest block, tool outputs masked by compaction events and resent in held results between
    them. Every forwarded body is the one a parse from scratch gives."""
    memo, scratch = _gateway(), _gateway()
    route = memo.router.resolve("m")
    assert route is not None
    marker = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are Claude Code.", "cache_control": marker}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing tests."}]
    events = 0
    for step in range(30):
        use = {"type": "tool_use", "id": f"toolu_{step}", "name": "Bash", "input": {"n": step}}
        output = f"line {step}: " + "error in module value handler " * 30
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": output}
        messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
        marked = copy.deepcopy(messages)
        marked[-1]["content"][-1]["cache_control"] = marker
        sent = orjson.dumps({"model": "m", "max_tokens": 100, "system": system, "messages": marked})
        expected = await scratch.engine.prepare(
            MESSAGES.parse(sent, 10_000), route, "a", window=2_000
        )
        resumed = memo.parse(MESSAGES, sent, "a")
        forwarded = await memo.engine.prepare(resumed, route, "a", window=2_000)
        assert forwarded.body == expected.body
        events += expected.chain is not None and expected.chain.changed
    assert events > 10 and memo.resent.reused > 0  # compacted turns, parses resumed


def test_a_resent_message_is_rendered_from_what_the_step_made_of_it_this_time() -> None:
    """The same client message, resent, masked one way on one request and another way on the
    next: each body carries that request's own rewrite (a render is reused only for the very
    objects it was made from)."""
    gw = _gateway()
    use = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"cmd": "ls"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb\nc"}
    body = orjson.dumps(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": "List the files."},
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [result]},
            ],
        }
    )
    for text in ("[output 1 masked]", "[output 1 cut: a]"):
        request = gw.parse(MESSAGES, body, "a")
        messages = [
            Message(data, 1, origin=i).with_data({**data, "content": text}, 1)
            if data["role"] == "tool"
            else Message(data, 1, origin=i)
            for i, data in enumerate(request.messages)
        ]
        sent = request.forward_payload(messages, None)
        assert sent["messages"][2]["content"] == [{**result, "content": text}]
