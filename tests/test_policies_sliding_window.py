"""`sliding_window` (design D5.5): the most recent Turns that fit, N decided by the budget."""

from __future__ import annotations

from policies import check, run_chain
from policies.registry import build_policy
from policies.steps.sliding_window import SlidingWindow, SlidingWindowConfig
from tests.policy_strategies import budget, chat, conv, env, prefix_changes


def window(**config: object) -> SlidingWindow:
    return SlidingWindow(SlidingWindowConfig(**config))


def test_keeps_the_most_recent_whole_turns_under_the_target() -> None:
    conversation = conv(chat(40))
    limits = budget(3000)
    result = window().apply(conversation, limits, env())
    out = result.conversation.messages
    assert out[0] == conversation.messages[0]
    assert out[1].role == "user"
    assert out[1:] == conversation.messages[-(len(out) - 1) :]
    assert result.conversation.tokens <= limits.trigger
    assert check(conversation, result.conversation) == []


def test_max_turns_caps_the_window_and_jumps_rather_than_slides() -> None:
    sizes = []
    for turns in range(10, 31):
        conversation = conv(chat(turns, words=4))
        result = window(max_turns=10).apply(conversation, budget(1_000_000), env())
        kept = sum(1 for m in result.conversation.messages if m.role == "user")
        sizes.append(kept)
        assert kept <= 10
    # the window only moves when it passes 10 Turns, then back to 7 (10 x 0.6/0.8)
    assert sizes[:2] == [10, 7] and max(sizes) == 10 and min(sizes) == 7


def test_keep_last_turns_is_respected() -> None:
    conversation = conv(chat(6, words=400))
    result = window(keep_last_turns=3).apply(conversation, budget(1000), env())
    assert sum(1 for m in result.conversation.messages if m.role == "user") == 3


def test_prefix_is_stable_between_events() -> None:
    data = chat(150)
    policy = build_policy("w", [{"type": "sliding_window"}])
    stable, events = prefix_changes(
        run_chain(conv(data[:end]), budget(6000), policy, env()).conversation.data()
        for end in range(3, len(data), 2)
    )
    assert events >= 3 and stable > 4 * events
