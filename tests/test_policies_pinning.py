"""Pinning (design D5.12): the client's `compactgate` marks and the operator's `pin_rules`."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from policies import check, run_chain
from policies.pinning import Marks, PinRule, apply_pin_rules, marks_from_extension, split_extension
from policies.registry import build_policy
from policies.steps.sandwich import Sandwich, SandwichConfig
from tests.policy_strategies import assistant_calls, budget, chat, conv, env, msg, tool


def test_marks_from_extension() -> None:
    assert marks_from_extension(None) == Marks(False, None, None)
    assert marks_from_extension({"pin": True, "priority": 1, "type": "plan_ref"}) == Marks(
        True, 1, "plan_ref"
    )
    pin, priority, kind = marks_from_extension({"type": "log"})
    assert (pin, priority, kind) == (False, None, "log")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("yes", "must be an object"),
        ({"pin": "true"}, "compactgate.pin"),
        ({"priority": 0}, "compactgate.priority"),
        ({"priority": 4}, "compactgate.priority"),
        ({"priority": True}, "compactgate.priority"),
        ({"type": "summary"}, "compactgate.type"),
        ({"pinned": True}, "unknown field(s) pinned"),
    ],
)
def test_bad_marks_are_clear_errors(value: object, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        marks_from_extension(value)
    assert needle in str(info.value)


def test_split_extension_strips_it() -> None:
    data = {"role": "user", "content": "x", "compactgate": {"pin": True}}
    forward, marks = split_extension(data)
    assert forward == {"role": "user", "content": "x"} and marks.pin


def test_pin_rules() -> None:
    data = [
        msg("system", "s"),
        msg("user", "TODO: ship it"),
        assistant_calls("c1", name="read_plan"),
        tool("c1", "the plan"),
        msg("assistant", "fine"),
    ]
    messages = conv(data).messages
    pinned = apply_pin_rules(messages, [PinRule(content_regex=r"^TODO")])
    assert [m.pin for m in pinned] == [False, True, False, False, False]
    by_tool = apply_pin_rules(messages, [PinRule(tool_name="read_plan")])
    assert [m.pin for m in by_tool] == [False, False, True, True, False]
    both = apply_pin_rules(messages, [PinRule(role="assistant", content_regex="fine")])
    assert [m.pin for m in both] == [False, False, False, False, True]
    with pytest.raises(ValidationError):
        PinRule()
    with pytest.raises(ValidationError):
        PinRule(content_regex="(")


def test_pinned_messages_survive_every_dropping_step() -> None:
    data = chat(40)
    conversation = conv(data, pins=[3])
    for steps in (["fifo"], ["sliding_window"], ["discard_low_rel"], ["prioritize_recent"], []):
        policy = build_policy("p", [{"type": s} for s in steps] or None)
        result = run_chain(conversation, budget(2500), policy, env())
        assert conversation.messages[3] in result.conversation.messages
        assert check(conversation, result.conversation) == []
    summarised = Sandwich(SandwichConfig()).apply(conversation, budget(2500), env())
    assert conversation.messages[3] in summarised.conversation.messages
