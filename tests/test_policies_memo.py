"""`policies.memo`: a bounded memo of pure per-text results that never changes an output."""

from __future__ import annotations

from dataclasses import replace

import orjson
from hypothesis import HealthCheck, given, settings

from policies import Budget, Conversation, Memo, build_policy, run_chain
from policies.registry import STEPS, build_step
from tests.policy_strategies import budgets, conversations, env


def test_memo_is_bounded_and_keeps_recent_entries() -> None:
    memo = Memo(max_entries=3, max_chars=100)
    calls: list[str] = []

    def compute(key: str) -> str:
        calls.append(key)
        return key.upper()

    for key in ["a", "b", "c", "a", "d"]:  # "a" used again: "b" is the oldest when "d" comes
        assert memo.get(("up", key), lambda key=key: compute(key), 10) == key.upper()
    assert calls == ["a", "b", "c", "d"]
    assert len(memo) == 3 and memo.chars == 30
    memo.get(("up", "b"), lambda: compute("b"), 10)
    assert calls[-1] == "b"  # was evicted
    memo.get(("up", "huge"), lambda: compute("huge"), 1000)  # larger than the bound: not kept
    memo.get(("up", "huge"), lambda: compute("huge"), 1000)
    assert calls[-2:] == ["huge", "huge"]
    memo.get(("up", "e"), lambda: compute("e"), 90)  # the char bound evicts the oldest
    assert memo.chars <= 100


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), conversations(), budgets)
def test_a_shared_memo_never_changes_an_output(
    first: Conversation, second: Conversation, budget: Budget
) -> None:
    """Every step and the default chain give the same result with a fresh memo and with one
    that already served other conversations (and this one)."""
    shared = Memo()
    policy = build_policy("default")
    uids: dict[bytes, int] = {}
    for conversation in (first, second, first):
        alone = run_chain(conversation, budget, policy, env())
        # The gateway's uids (equal uid: equal data), which memoise the summary links.
        seen = with_uids(conversation, uids)
        warm = run_chain(seen, budget, policy, env(memo=shared))
        assert warm.conversation.data() == alone.conversation.data()
        assert [r.as_dict() for r in warm.steps] == [r.as_dict() for r in alone.steps]
        for name in sorted(STEPS):
            step = build_step(STEPS[name][0]())
            a = step.apply(conversation, budget, env())
            b = step.apply(seen, budget, env(memo=shared))
            assert b.conversation.data() == a.conversation.data()
            assert b.pending == a.pending


def with_uids(conversation: Conversation, uids: dict[bytes, int]) -> Conversation:
    """Fresh copies of the messages, each with a uid shared by every message of equal data."""

    def uid(data: object) -> int:
        return uids.setdefault(orjson.dumps(data, option=orjson.OPT_SORT_KEYS), len(uids) + 1)

    return Conversation(
        tuple(replace(m, data=dict(m.data), uid=uid(m.data)) for m in conversation.messages)
    )
