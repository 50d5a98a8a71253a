"""Request validation (design D15.3): every bad body is a clear 400 naming its param."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import InvalidRequestError
from gateway.wire import parse_chat_request


def parse(value: object) -> object:
    return parse_chat_request(orjson.dumps(value), max_messages=100)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": {}}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": 3, "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
        ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
            "messages[0].content[0]",
        ),
        (
            {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": 1}]}]},
            "messages[0].tool_calls[0]",
        ),
        ({"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}, "stream"),
        (
            {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
            "max_tokens",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x", "compactgate": {"priority": 9}}],
            },
            "messages[0].compactgate.priority",
        ),
    ],
)
def test_bad_bodies_name_the_param(body: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse(body)
    assert info.value.param == param
    assert info.value.status == 400
    error = orjson.loads(info.value.body())["error"]
    assert (
        set(error) == {"message", "type", "param", "code"}
        and error["type"] == "invalid_request_error"
    )


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,2]", b"\xff\xfe", b'"text"'])
def test_non_object_json_is_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError):
        parse_chat_request(raw, max_messages=100)


def test_too_many_messages_is_400() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}] * 101}
    with pytest.raises(InvalidRequestError) as info:
        parse(body)
    assert "at most 100" in info.value.message


def test_extension_is_read_and_stripped_unknown_fields_kept() -> None:
    body = {
        "model": "m",
        "temperature": 0.2,
        "x_vendor": {"a": 1},
        "messages": [
            {
                "role": "user",
                "content": "keep me",
                "compactgate": {"pin": True, "priority": 1, "type": "plan_ref"},
            }
        ],
    }
    request = parse(body)
    assert request.has_extension
    assert (
        request.marks[0].pin
        and request.marks[0].priority == 1
        and request.marks[0].kind == "plan_ref"
    )
    forwarded = request.forward_payload(None, None)
    assert forwarded["messages"] == [{"role": "user", "content": "keep me"}]
    assert forwarded["temperature"] == 0.2 and forwarded["x_vendor"] == {"a": 1}


@pytest.mark.parametrize(
    ("extension", "param", "needle"),
    [
        ("yes", "messages[0].compactgate", "must be an object"),
        ({"pin": "true"}, "messages[0].compactgate.pin", "must be a boolean"),
        ({"priority": 0}, "messages[0].compactgate.priority", "must be 1, 2 or 3"),
        ({"priority": 4}, "messages[0].compactgate.priority", "must be 1, 2 or 3"),
        ({"priority": True}, "messages[0].compactgate.priority", "must be 1, 2 or 3"),
        ({"type": "summary"}, "messages[0].compactgate.type", "must be one of"),
        ({"pinned": True}, "messages[0].compactgate", "unknown keys: pinned"),
    ],
)
def test_bad_marks_are_400s_naming_the_field(extension: object, param: str, needle: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x", "compactgate": extension}]}
    with pytest.raises(InvalidRequestError) as info:
        parse(body)
    assert info.value.param == param and info.value.status == 400
    assert info.value.message.startswith(param) and needle in info.value.message


def test_marks_default_to_none_and_type_alone_is_kept() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b", "compactgate": {"type": "log"}},
        ],
    }
    first, second = parse(body).marks  # type: ignore[attr-defined]
    assert (first.pin, first.priority, first.kind) == (False, None, None)
    assert (second.pin, second.priority, second.kind) == (False, None, "log")
