"""`policies.conversation`: the derived facts a Conversation caches are the ones it would compute."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from policies import Budget, Conversation, parse_turns
from policies.conversation import tool_groups
from policies.registry import STEPS, build_step
from policies.rollup import Units, anchored
from tests.policy_strategies import budgets, conversations, env


def recomputed(conversation: Conversation) -> Conversation:
    return Conversation(conversation.messages)


def facts(conversation: Conversation) -> tuple[object, ...]:
    return (
        conversation.roles(),
        conversation.turns(),
        conversation.latest_user_index(),
        conversation.protected(),
        conversation.head_end(),
        conversation.tokens,
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), budgets)
def test_derived_facts_match_the_messages(conversation: Conversation, budget: Budget) -> None:
    messages = conversation.messages
    assert conversation.roles() == tuple(m.role for m in messages)
    assert conversation.protected() == tuple(
        bool(conversation.is_protected(i)) for i in range(len(messages))
    )
    assert conversation.turns() == parse_turns(messages, conversation.head_end())
    for name in ("tool_output_cache", "content_type_chunking"):  # steps that keep the facts
        facts(conversation)  # computed on the input, then carried over
        result = build_step(STEPS[name][0]()).apply(conversation, budget, env()).conversation
        assert facts(result) == facts(recomputed(result))
        assert tool_groups(result.messages) == tool_groups(messages)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_segments_after_a_safe_point_are_the_ones_scanned_from_it(
    conversation: Conversation,
) -> None:
    """`sandwich` scans the tool-group-safe segments once and takes the ones after its top: the
    same segments a scan starting there finds (no call is open at a safe point)."""
    whole = Units.of_segments(conversation, conversation.head_end())
    for bound in whole.bounds:
        assert whole.after(bound) == Units.of_segments(conversation, bound)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_anchored_messages_keep_their_whole_tool_groups(conversation: Conversation) -> None:
    """R3.3 for summaries: a message no summary may replace takes its tool group with it."""
    fixed = anchored(conversation)
    for i, message in enumerate(conversation.messages):
        if message.pin or (message.role in ("system", "developer") and message.origin >= 0):
            assert i in fixed
    for group in tool_groups(conversation.messages):
        assert fixed.isdisjoint(group) or fixed.issuperset(group)
