"""A resent history is not checked again, yet every invalid message is still a 400 (wire/validated).

The chat endpoint remembers each caller's last valid request per conversation and skips the
checks of messages equal to it. Whatever the previous request was, the answer to the next one
must be what a parser that remembers nothing gives: the same request, or the same 400 with the
same message and `param`.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequestError
from gateway.wire.chat import CHAT, ChatWire
from gateway.wire.resent import ResentMessages
from gateway.wire.validated import ValidatedMessages

MAX = 50

_text = st.text(max_size=8)
# Values JSON can carry, valid or not in any field a message check reads.
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_valid = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, _text),
    st.builds(lambda c: {"role": "system", "content": c}, _text),
    st.builds(
        lambda c, i: {
            "role": "assistant",
            "content": c,
            "tool_calls": [{"id": i, "type": "function", "function": {"name": "f"}}],
        },
        st.none() | _text,
        _text,
    ),
    st.builds(lambda c, i: {"role": "tool", "tool_call_id": i, "content": c}, _text, _text),
    st.builds(
        lambda t: {"role": "user", "content": [{"type": "text", "text": t}]},
        _text,
    ),
    st.builds(  # the gateway's own field, read into marks and stripped
        lambda c, pin: {"role": "user", "content": c, "compactgate": {"pin": pin}},
        _text,
        st.booleans(),
    ),
)
_field = st.sampled_from(
    ["role", "content", "name", "tool_call_id", "tool_calls", "x", "compactgate"]
)


@st.composite
def _changed(draw: st.DrawFn, message: dict[str, Any]) -> Any:
    """`message` with one field set to any JSON value, removed, or the message replaced."""
    how = draw(st.sampled_from(["set", "drop", "replace"]))
    if how == "replace":
        return draw(_json)
    field = draw(_field)
    changed = dict(message)
    if how == "drop":
        changed.pop(field, None)
    else:
        changed[field] = draw(_json)
    return changed


def _outcome(wire: ChatWire, body: dict[str, Any], tenant: str | None) -> Any:
    scope = ResentMessages().scope(tenant) if tenant is not None else None
    try:
        request = wire.parse(orjson.dumps(body), MAX, scope)
    except InvalidRequestError as error:
        return ("400", error.status, error.message, error.param)
    return ("ok", request.messages, request.marks, request.has_extension)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), history=st.lists(_valid, min_size=1, max_size=8))
def test_a_changed_message_anywhere_gets_the_same_answer_as_without_memory(
    data: st.DataObject, history: list[dict[str, Any]]
) -> None:
    wire = ChatWire(ValidatedMessages())
    first = {"model": "m", "messages": history}
    assert _outcome(wire, first, "t")[0] == "ok"  # remembered
    at = data.draw(st.integers(0, len(history)), label="changed at")
    messages = list(history)
    if at == len(history):
        messages.append(data.draw(_json | _valid, label="appended"))
    else:
        messages[at] = data.draw(_changed(history[at]), label="changed")
    second = {"model": "m", "messages": messages}
    assert _outcome(wire, second, "t") == _outcome(CHAT, second, None)


@settings(max_examples=100, deadline=None)
@given(history=st.lists(_valid, min_size=3, max_size=6), bad=_json)
def test_a_prefix_message_made_invalid_is_rejected(history: list[dict[str, Any]], bad: Any) -> None:
    """The prefix was valid last time; a resend that breaks a role inside it (the opening
    messages, which find the conversation, unchanged) is a 400 naming it, as it would be on a
    gateway that never saw the conversation."""
    wire = ChatWire(ValidatedMessages())
    _outcome(wire, {"model": "m", "messages": history}, "t")
    role = bad if bad not in ("user", "system", "assistant", "tool") else 3
    broken = [*history[:2], dict(history[2], role=role), *history[3:]]
    error = _outcome(wire, {"model": "m", "messages": broken}, "t")
    assert error[:2] == ("400", 400)
    assert error[3] == "messages[2].role"


def test_memory_is_per_caller_and_bounded() -> None:
    memo = ValidatedMessages(max_conversations=2)
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    memo.remember(memo.known("a", history), history, 10, False)
    assert memo.known("a", history).count == 2
    assert memo.known("b", history).count == 0  # another caller checks its own
    for n in range(2):
        other = [{"role": "user", "content": str(n)}]
        memo.remember(memo.known("a", other), other, 10, False)
    assert memo.known("a", history).count == 0  # the oldest conversation was dropped
