"""A body parsed by resuming its conversation's previous body is exactly the body parsed whole.

Sessions of bodies are generated and each is edited the way clients, people and attackers do:
messages appended or cut, an earlier message changed (its text, its key order, a number written
as a float or a boolean), fields before or after the messages array changed or duplicated, the
body written with spaces or with escapes, bytes overwritten anywhere. Every body of a session
goes through one memo in turn, and each answer is compared with `load_object`'s: the same data,
key order and number types, or the same 400.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.devtools.parts import parts
from gateway.errors import InvalidRequestError
from gateway.wire.chat import ChatWire
from gateway.wire.fields import load_object
from gateway.wire.resent import ResentMessages
from gateway.wire.resumed import KEY_BYTES, ResumedBodies, _closest
from gateway.wire.validated import ValidatedMessages
from tests.configs import compacting

KEYS = ("model", "max_tokens", "messages", "tools", "stream", "n", "role", "content", "x")
EDITS = ("append", "cut", "change", "keys", "number", "head", "tail", "bytes", "writer")
WRITERS = ("orjson", "orjson", "orjson", "spaces", "ascii", "duplicate", "messages again")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=8,
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(("system", "user", "assistant")), "content": values},
    optional={"n": values, "x": values},
)
fields = st.dictionaries(st.sampled_from(KEYS[:2] + KEYS[3:]), values, max_size=3)


def _shape(value: Any) -> Any:
    """`value` with every type and key order spelled out (`1`, `1.0` and `True` differ)."""
    if isinstance(value, dict):
        return ("dict", [(key, _shape(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [_shape(item) for item in value])
    return (type(value).__name__, repr(value))


def _written(head: dict[str, Any], items: list[Any], tail: dict[str, Any], writer: str) -> bytes:
    payload = {**head, "messages": items, **{k: v for k, v in tail.items() if k not in head}}
    if writer == "spaces":
        return json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if writer == "ascii":
        return json.dumps(payload, separators=(",", ":")).encode()
    body = orjson.dumps(payload)
    if writer == "duplicate":  # a field written again after the array: the last one counts
        key = next(iter(head), "messages")
        body = body[:-1] + b"," + orjson.dumps(key) + b':"again"}'
    elif writer == "messages again":  # an array that opens the way the memo's placeholder does
        body = body[:-1] + b',"messages":[0,' + orjson.dumps(items[-1:]) + b"]}"
    return body


def _edit(
    draw: st.DrawFn, head: dict[str, Any], items: list[Any], tail: dict[str, Any]
) -> tuple[dict[str, Any], list[Any], dict[str, Any], bytes | None]:
    """One edit of a body; bytes when the edit is made to the written body itself."""
    edit = draw(st.sampled_from(EDITS))
    items = list(items)
    at = draw(st.integers(0, max(0, len(items) - 1)))
    if edit == "append":
        items += draw(st.lists(messages, min_size=1, max_size=3))
    elif edit == "cut" and items:
        items = items[:at]
    elif edit == "change" and items:
        items[at] = draw(messages)
    elif edit == "keys" and items:
        items[at] = {k: items[at][k] for k in reversed(items[at])}
    elif edit == "number" and items:
        number = draw(st.sampled_from((1, 1.0, True, 0, 0.0, False, -0.0)))
        items[at] = {**items[at], "content": number}
    elif edit == "head":
        head = draw(fields)
    elif edit == "tail":
        tail = draw(fields)
    elif edit == "bytes":
        body = _written(head, items, tail, "orjson")
        start = draw(st.integers(0, len(body)))
        end = draw(st.integers(start, min(len(body), start + 4)))
        new = draw(st.sampled_from((b"", b",", b"]", b"}", b" ", b"0", b'"', b"[0,", b"\\")))
        return head, items, tail, body[:start] + new + body[end:]
    return head, items, tail, None


@st.composite
def sessions(draw: st.DrawFn) -> list[bytes]:
    head = draw(fields)
    items = draw(st.lists(messages, max_size=6))
    tail = draw(fields)
    bodies = [_written(head, items, tail, "orjson")]
    for _ in range(draw(st.integers(1, 6))):
        head, items, tail, body = _edit(draw, head, items, tail)
        bodies.append(body or _written(head, items, tail, draw(st.sampled_from(WRITERS))))
    return bodies


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions())
def test_a_resumed_body_is_exactly_the_body_parsed_whole(bodies: list[bytes]) -> None:
    memo = ResumedBodies(min_bytes=0)
    for body in bodies:
        try:
            expected = load_object(body)
        except InvalidRequestError as error:
            with pytest.raises(InvalidRequestError) as raised:
                memo.load("t", body, "messages")
            assert raised.value.message == error.message
            continue
        assert _shape(memo.load("t", body, "messages")) == _shape(expected)


def _agent_body(turns: int, last: str = "Go on.") -> bytes:
    history = [{"role": "system", "content": "You are a coding agent. " + "Be brief. " * 2000}]
    for turn in range(turns):
        history.append({"role": "user", "content": f"Step {turn}: read the file."})
        history.append({"role": "assistant", "content": f"Read {turn}", "tool_calls": None})
    history.append({"role": "user", "content": last})
    return orjson.dumps({"model": "m", "messages": history, "max_tokens": 256, "tools": []})


def test_a_resent_history_is_not_parsed_again() -> None:
    """Each turn takes over the previous turn's parse of every message it resends as it was,
    the very objects; another tenant's identical body is parsed for itself."""
    memo = ResumedBodies(min_bytes=0)
    first = memo.load("a", _agent_body(20), "messages")
    again = memo.load("a", _agent_body(20, "Now run the tests."), "messages")
    assert memo.reused == 41  # all but the changed last message
    assert all(x is y for x, y in zip(first["messages"][:41], again["messages"], strict=False))
    assert again["messages"][41] == {"role": "user", "content": "Now run the tests."}
    longer = memo.load("a", _agent_body(21), "messages")  # two messages more, the last changed
    assert memo.reused == 41 + 41
    assert longer["messages"][40] is again["messages"][40]
    other = memo.load("b", _agent_body(21), "messages")
    assert other == longer and other["messages"][1] is not longer["messages"][1]


def test_two_conversations_that_open_alike_each_resume_their_own() -> None:
    memo = ResumedBodies(min_bytes=0)
    one = _agent_body(10, "First conversation.")
    two = one.replace(b"Step 1:", b"Other 1:")  # the same opening bytes, another history
    memo.load("a", one, "messages")
    memo.load("a", two, "messages")
    memo.reused = 0
    memo.load("a", one.replace(b"First conversation.", b"Next."), "messages")
    memo.load("a", two.replace(b"First conversation.", b"Next."), "messages")
    assert memo.reused == 2 * 21


def test_a_body_not_written_compactly_is_parsed_whole() -> None:
    """A body with spaces after its separators (Python's `json.dumps`) cannot be proven equal to
    a previous parse byte for byte: it is parsed whole, every time."""
    memo = ResumedBodies(min_bytes=0)
    payload = orjson.loads(_agent_body(5))
    for last in ("a", "b"):
        payload["messages"][-1]["content"] = last
        assert memo.load("a", json.dumps(payload).encode(), "messages") == payload
    assert memo.reused == 0


def test_a_chat_request_parsed_by_resuming_is_the_request_parsed_whole() -> None:
    """Through the chat adapter, as its endpoint calls it: every field of the request the same
    as a parse without the memos, our extension read and stripped in both."""
    wire, resent = ChatWire(ValidatedMessages()), ResentMessages()
    payload = orjson.loads(_agent_body(8))
    for turn in range(4):
        payload["messages"].append({"role": "user", "content": f"turn {turn}"})
        if turn == 2:
            payload["messages"][3]["compactgate"] = {"pin": True}
        body = orjson.dumps(payload)
        resumed = wire.parse(body, 1000, resent.scope("a"))
        fresh = ChatWire().parse(body, 1000)
        assert _shape(resumed.payload) == _shape(fresh.payload)
        assert _shape(resumed.messages) == _shape(fresh.messages)
        assert (resumed.marks, resumed.has_extension) == (fresh.marks, fresh.has_extension)
    assert resent.bodies.reused > 0


def test_a_small_body_is_parsed_whole() -> None:
    """Under `min_bytes` orjson reads the whole body about as fast as a resume: nothing is kept."""
    memo = ResumedBodies()
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi."}]})
    for _ in range(2):
        assert memo.load("a", body, "messages") == orjson.loads(body)
    assert memo.reused == 0


async def test_a_resumed_chat_request_is_forwarded_as_the_request_parsed_whole() -> None:
    """Turn after turn of a long chat session over a window that makes it compact: every body the
    gateway would forward is the one a gateway without the memos forwards."""
    config = compacting()
    memo, scratch = parts(parse_config(config)), parts(parse_config(config))
    route = memo.router.resolve("m")
    assert route is not None
    wire = ChatWire(ValidatedMessages())
    payload = orjson.loads(_agent_body(30))
    changed = 0
    for turn in range(10):
        payload["messages"].append({"role": "user", "content": f"turn {turn} " + "x " * 400})
        body = orjson.dumps({**payload, "model": "m"})
        resumed = memo.parse(wire, body, "a")
        fresh = ChatWire().parse(body, 10_000)
        forwarded = await memo.engine.prepare(resumed, route, "a", window=6_500)
        expected = await scratch.engine.prepare(fresh, route, "a", window=6_500)
        assert forwarded.body == expected.body
        changed += forwarded.body != body
    assert changed and memo.resent.bodies.reused > 0


@st.composite
def shared_openings(draw: st.DrawFn) -> list[bytes]:
    """Bodies of several sessions that open with the same bytes (one agent's instructions),
    each session appending to, cutting or changing its own history, sent interleaved."""
    head = {"model": "m", "instructions": "Be brief. " * 30}
    histories = [draw(st.lists(messages, max_size=4)) for _ in range(draw(st.integers(2, 6)))]
    bodies = []
    for _ in range(draw(st.integers(1, 16))):
        at = draw(st.integers(0, len(histories) - 1))
        _, items, _, edited = _edit(draw, head, histories[at], {})
        histories[at] = items
        bodies.append(edited or _written(head, items, {}, "orjson"))
    return bodies


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_openings())
def test_among_bodies_that_open_alike_the_one_sharing_most_is_resumed(bodies: list[bytes]) -> None:
    """Bodies that open alike share a key: each is still exactly the body parsed whole, and
    it resumes from the kept body that shares the most whole messages with it, found among
    the two it sorts between as well as by comparing it with every kept body."""
    memo = ResumedBodies(min_bytes=0)
    for body in bodies:
        kept = memo._entries.get(("t", "messages", body[:KEY_BYTES]))
        if kept is not None:
            assert kept.bodies == sorted(kept.bodies)
            _, most = _closest(kept.layouts, body)  # every kept body, one by one
            assert kept.closest(body)[1] == most
        try:
            expected = load_object(body)
        except InvalidRequestError:
            continue
        assert _shape(memo.load("t", body, "messages")) == _shape(expected)


def _session_body(session: int, turns: int) -> bytes:
    """A turn of one session of an agent: the agent's system prompt, the session's history."""
    return _agent_body(turns, "Go on.").replace(b"read the file", b"read file %d" % session)


def test_many_sessions_of_one_agent_each_resume_their_own() -> None:
    """Forty sessions of one agent and tenant (the same system prompt, so the same opening
    bytes) taking turns: each turn takes over its own session's previous parse. A key keeps
    to half of the memo's bytes, the bodies stored longest ago leaving first."""
    memo = ResumedBodies(min_bytes=0)
    sessions = 40
    for turns in (10, 11, 12):
        for session in range(sessions):
            memo.load("a", _session_body(session, turns), "messages")
    # The first turn of each session shares only the system prompt with another session's;
    # later turns share all their session's previous messages (2 * turns + 1) but the last.
    assert memo.reused == (sessions - 1) * 1 + sessions * 21 + sessions * 23
    body = _session_body(0, 12)
    small = ResumedBodies(min_bytes=0, max_bytes=3 * len(body))
    for session in range(3):
        small.load("a", _session_body(session, 12), "messages")
    kept = small._entries.get(("a", "messages", body[:KEY_BYTES]))
    assert kept is not None and len(kept.bodies) == 1
    assert kept.bodies[0] == _session_body(2, 12)


def test_the_fields_after_a_resent_history_are_taken_over_when_their_bytes_are_the_same() -> None:
    """An agent's tools and instructions follow its history in every body: when they are the
    same bytes as last time they are the same objects (not parsed again), and when they change
    they are the new body's."""
    tools = [
        {"type": "function", "function": {"name": f"tool{i}", "parameters": {}}} for i in range(40)
    ]

    def body(turns: int, tools: list[Any]) -> bytes:
        payload = orjson.loads(_agent_body(turns))
        return orjson.dumps({**payload, "tools": tools, "stream": True})

    memo = ResumedBodies()
    first = memo.load("t", body(3, tools), "messages")
    second = memo.load("t", body(4, tools), "messages")
    assert second == load_object(body(4, tools))
    assert second["tools"] is first["tools"]
    changed = tools[:-1]
    third = memo.load("t", body(5, changed), "messages")
    assert third == load_object(body(5, changed)) and third["tools"] == changed
