"""Pinning (design D5.12): the operator's `pin_rules`, and pinned messages kept by every step (the
client's `compactgate` marks are read in tests/test_chat_request.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from policies import check, run_chain
from policies.pinning import PinRule, apply_pin_rules
from policies.registry import build_policy
from policies.steps.sandwich import Sandwich, SandwichConfig
from tests.policy_strategies import assistant_calls, budget, chat, conv, env, msg, tool


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
