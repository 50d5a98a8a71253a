"""A Responses parse resumes the conversation's previous one after the items resent as they
were (Codex resends its whole `input` every turn), and gives exactly what a parse from scratch
gives: the same canonical messages, marks, layout and forwarded body, or the same 400."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.devtools.parts import parts
from gateway.wire import RESPONSES
from gateway.wire.base import WireRequest
from tests.configs import compacting
from tests.resume_checks import resumed_as_fresh, same_messages
from tests.wire_strategies import responses_bodies

EDITS = ("text", "keys", "extension", "reorder", "drop", "unknown")


def _edited(items: list[Any], edit: str, at: int, other: int) -> list[Any]:
    items = copy.deepcopy(items)
    if not items or edit == "none":
        return items
    at, other = at % len(items), other % len(items)
    item = items[at]
    if edit == "text":
        item["output" if "output" in item else "id"] = "edited"
    elif edit == "keys":  # equal dicts, other JSON
        items[at] = {k: item[k] for k in reversed(item)}
    elif edit == "extension":
        item["compactgate"] = {"pin": True}
    elif edit == "reorder":
        items[at], items[other] = items[other], items[at]
    elif edit == "drop":
        del items[at]
    elif edit == "unknown":  # an item of a kind the gateway does not know, riding along
        items.insert(at, {"type": "future_item_kind", "id": f"x_{at}"})
    return items


def _same_request(resumed: WireRequest, fresh: WireRequest) -> None:
    same_messages(resumed, fresh)
    old, new = resumed.layout, fresh.layout
    assert orjson.dumps(old.items) == orjson.dumps(new.items)
    assert (old.spans, old.string_input) == (new.spans, new.string_input)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    responses_bodies(),
    st.lists(
        st.tuples(
            st.floats(0, 1),  # how much of the session the request holds
            st.one_of(st.just("none"), st.sampled_from(EDITS)),
            st.integers(0, 80),
            st.integers(0, 80),
            st.booleans(),  # stateful (previous_response_id)
        ),
        min_size=2,
        max_size=10,
    ),
    st.booleans(),
    st.sampled_from((600, 1_200, 100_000)),
)
async def test_a_resumed_responses_parse_is_a_parse_from_scratch(
    body: dict[str, Any],
    requests: list[tuple[float, str, int, int, bool]],
    in_order: bool,
    window: int,
) -> None:
    """`in_order`: the requests hold ever more of the session, as Codex's turns do."""
    memo, scratch = parts(parse_config(compacting())), parts(parse_config(compacting()))
    session = body["input"]
    if in_order:
        requests = sorted(requests, key=lambda request: request[0])
    for share, edit, at, other, stateful in requests:
        end = max(1, round(share * len(session)))
        sent_body = {**body, "input": _edited(session[:end], edit, at, other)}
        if stateful:
            sent_body["previous_response_id"] = "resp_1"
        sent = orjson.dumps(sent_body)
        await resumed_as_fresh(memo, scratch, RESPONSES, sent, "a", window, _same_request)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    responses_bodies(),
    st.lists(
        st.tuples(
            st.integers(0, 3),  # which session sends it
            st.floats(0, 1),  # how much of that session the request holds
            st.one_of(st.just("none"), st.sampled_from(EDITS)),
            st.integers(0, 80),
            st.integers(0, 80),
        ),
        min_size=2,
        max_size=12,
    ),
    st.sampled_from((600, 100_000)),
)
async def test_sessions_that_open_alike_each_parse_as_from_scratch(
    body: dict[str, Any], requests: list[tuple[int, float, str, int, int]], window: int
) -> None:
    """Sessions of one agent and tenant open with the same items (Codex's developer messages)
    and go on with their own, sent in any order: whichever kept request each one is matched
    with, the parse and the forwarded body are those of a parse from scratch."""
    memo, scratch = parts(parse_config(compacting())), parts(parse_config(compacting()))
    opening, rest = body["input"][:2], body["input"][2:]
    for session, share, edit, at, other in requests:
        own = {"type": "message", "role": "user", "content": f"Session {session}."}
        items = [*opening, own, *rest]
        end = max(1, round(share * len(items)))
        sent = orjson.dumps({**body, "input": _edited(items[:end], edit, at, other)})
        await resumed_as_fresh(memo, scratch, RESPONSES, sent, "a", window, _same_request)


def test_a_codex_turn_reuses_the_parse_of_the_items_it_resends() -> None:
    """Each turn appends the model's calls, their outputs and a new user message: the messages
    made from the resent items are the very objects of the previous turn's parse."""
    gw = parts(parse_config(compacting()))
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Fix it."}]
    previous: WireRequest | None = None
    for step in range(6):
        items += [
            {"type": "reasoning", "id": f"rs_{step}", "summary": [], "encrypted_content": "gA=="},
            {"type": "function_call", "call_id": f"c{step}", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{step}", "output": f"ok {step}"},
        ]
        sent = orjson.dumps({"model": "m", "instructions": "Be brief.", "input": items})
        request = gw.parse(RESPONSES, sent, "a")
        _same_request(request, RESPONSES.parse(sent, 10_000))
        if previous is not None:  # instructions, the task, every finished call and output
            kept = len(previous.messages) - 1
            assert all(map(lambda a, b: a is b, request.messages[:kept], previous.messages))
        previous = request
    assert gw.resent.reused > 0


def test_an_item_that_rode_along_last_turn_is_not_kept_when_it_is_gone() -> None:
    """An unknown item after a tool output rides along with that output; when the next request
    no longer has it, the resumed parse must not carry it over (nor forward it)."""
    gw = parts(parse_config(compacting()))
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "Fix it."},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    unknown = {"type": "future_item_kind", "id": "x_1"}
    first = orjson.dumps({"model": "m", "input": [*items, unknown]})
    gw.parse(RESPONSES, first, "a")
    later = orjson.dumps(
        {"model": "m", "input": [*items, {"type": "message", "role": "user", "content": "Go on."}]}
    )
    resumed = gw.parse(RESPONSES, later, "a")
    _same_request(resumed, RESPONSES.parse(later, 10_000))
    assert gw.resent.reused > 0
    assert b"future_item_kind" not in orjson.dumps(RESPONSES.render(resumed, None, None, False))
