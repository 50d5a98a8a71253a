"""`policies.conversation`: the derived facts a Conversation caches are the ones it would compute."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import Budget, Conversation, Message, parse_turns
from policies.conversation import drop, inserted, tool_groups
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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.sets(st.integers(0, 40)), st.integers(0, 40), st.integers(1, 2))
def test_drop_and_insert_carry_the_facts_they_would_recompute(
    conversation: Conversation, indices: set[int], at: int, added: int
) -> None:
    """`drop` and a summary's insertion hand their result the roles and tool groups renumbered
    (so the next step does not work them out again); they must be the ones it would compute."""
    result, _ = drop(conversation, indices)
    assert result.roles() == recomputed(result).roles()
    assert result.tool_groups() == recomputed(result).tool_groups()
    at = min(at, len(result))
    new = [
        Message({"role": "system", "content": f"summary {i}"}, 3, origin=-1) for i in range(added)
    ]
    grown = inserted(result, at, new)
    assert grown.messages == (*result.messages[:at], *new, *result.messages[at:])
    assert grown.roles() == recomputed(grown).roles()
    assert grown.tool_groups() == recomputed(grown).tool_groups()
