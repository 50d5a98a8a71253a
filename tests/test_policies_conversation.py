"""`policies.conversation`: the derived facts a Conversation caches are the ones it would compute."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import Budget, Conversation, Message, parse_turns
from policies.conversation import drop, inserted, tool_groups
from policies.registry import STEPS, build_step
from policies.rollup import Units, anchored
from tests.policy_strategies import assistant_calls, budgets, conv, conversations, env, msg, tool


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
    """Tool groups stay whole for summaries: a message no summary may replace takes its tool group with it."""
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
    for carried in (result, grown):
        assert facts(carried) == facts(recomputed(carried))


@st.composite
def any_histories(draw: st.DrawFn) -> Conversation:
    """Histories in any order, valid or not: results away from their calls, results of
    unknown calls, calls never answered, pinned messages inside tool groups."""
    datas: list[dict[str, object]] = []
    issued: list[str] = []
    for n in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["user", "assistant", "calls", "calls", "tool", "tool", "sys"]))
        if kind == "calls":
            ids = [f"c{n}_{k}" for k in range(draw(st.integers(1, 3)))]
            issued += ids
            datas.append(assistant_calls(*ids))
        elif kind == "tool":
            datas.append(tool(draw(st.sampled_from([*issued, "unknown"])), "out"))
        else:
            datas.append(msg({"sys": "system"}.get(kind, kind), "text"))
    pins = draw(st.sets(st.integers(0, len(datas) - 1), max_size=3))
    return conv(datas, pins=sorted(pins))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(any_histories(), conversations()))
def test_segments_end_exactly_where_no_tool_group_is_split(conversation: Conversation) -> None:
    """Tool groups stay whole for `sandwich`, in any history: it cuts only between segments, so every segment end
    leaves each tool group wholly on one side; and every such point is a segment end, so a call
    never answered does not stop the middle from being summarised past it."""
    start, count = conversation.head_end(), len(conversation)
    groups = tool_groups(conversation.messages)
    splits = [
        cut for cut in range(start + 1, count + 1) if any(g[0] < cut <= g[-1] for g in groups)
    ]
    expected = [cut for cut in range(start + 1, count + 1) if cut not in splits]
    units = Units.of_segments(conversation, start)
    assert units.bounds == ((start, *expected) if start < count else ())


def reference_drop(conversation: Conversation, indices: set[int]) -> tuple[list[Message], int]:
    """`drop` as its docstring says it, written the plain way."""
    messages = conversation.messages
    wanted = {i for i in indices if 0 <= i < len(messages) and not conversation.is_protected(i)}
    for group in tool_groups(messages):
        if not wanted.issuperset(group):
            wanted.difference_update(group)
    return [m for i, m in enumerate(messages) if i not in wanted], len(wanted)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(any_histories(), conversations()), st.sets(st.integers(-2, 30)))
def test_drop_keeps_protected_messages_and_whole_tool_groups_in_any_history(
    conversation: Conversation, indices: set[int]
) -> None:
    """Design D1: what `drop` removes is exactly the unprotected `indices` whose tool
    groups are wholly among them, in any history (also ones whose results are away from
    their calls); and the facts it hands on are the ones the result would compute."""
    result, dropped = drop(conversation, indices)
    kept, expected = reference_drop(conversation, indices)
    assert list(result.messages) == kept
    assert dropped == expected
    assert facts(result) == facts(recomputed(result))
    assert result.tool_groups() == recomputed(result).tool_groups()
