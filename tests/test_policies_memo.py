"""`policies.memo`: a bounded memo of pure per-text results that never changes an output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings

from policies import Budget, Conversation, Env, Memo, build_policy, run_chain
from policies.conversation import content_text
from policies.registry import STEPS, build_step
from tests.policy_strategies import (
    FakeSummaries,
    budget,
    budgets,
    conv,
    conversations,
    count,
    env,
    ref_for,
)


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


def _halves(data: Mapping[str, Any]) -> int:
    """Another route's counting: two characters a token."""
    return 4 + len(content_text(data.get("content"))) // 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), budgets)
def test_one_memo_serving_routes_that_count_differently_never_changes_an_output(
    conversation: Conversation, budget: Budget
) -> None:
    """The gateway keeps one memo for all routes and tenants: what a step worked out with one
    route's counting (a ledger line's tokens, an excerpt's cut) or one tenant's refs must not
    be handed to another (`Env.scope` in the key; a 10,000-message request to a 400-token
    tiktoken model failed when a chars:4 route's line sizes let the ledger's block outgrow it)."""
    shared = Memo()
    policy = build_policy("default")
    run_chain(conversation, budget, policy, env(memo=shared, scope="a"))
    # the same messages counted by the other route
    recounted = Conversation(
        tuple(replace(m, tokens=_halves(m.data)) for m in conversation.messages)
    )

    def other(memo: Memo) -> Env:
        return Env(
            count=_halves,
            summaries=FakeSummaries(),
            ref_for=lambda text: "other_" + ref_for(text)[4:],
            count_text=lambda text: len(text) // 2,
            memo=memo,
            scope="b",
        )

    alone = run_chain(recounted, budget, policy, other(Memo()))
    warm = run_chain(recounted, budget, policy, other(shared))
    assert warm.conversation.data() == alone.conversation.data()
    assert [r.as_dict() for r in warm.steps] == [r.as_dict() for r in alone.steps]


def test_one_memo_serving_two_tenants_gives_each_its_own_refs() -> None:
    """The same large message cut for two tenants by one gateway: each tenant's excerpt names
    refs made with its own key (a ref made for one tenant is not readable by the other)."""
    from tests.test_policies_excerpt import large_session

    conversation = conv(large_session(outputs=4, lines=300))
    limits = budget(int(conversation.tokens * 0.5 / 0.6))
    policy = build_policy("p", [{"type": "excerpt"}])
    shared = Memo()
    first = run_chain(conversation, limits, policy, env(memo=shared, scope="a"))
    other = Env(
        count=count,
        summaries=FakeSummaries(),
        ref_for=lambda text: "other_" + ref_for(text)[4:],
        memo=shared,
        scope="b",
    )
    second = run_chain(conversation, limits, policy, other)
    assert first.stored and "ref=ref_" in str(first.conversation.data())
    assert "ref=other_" in str(second.conversation.data())
    assert "ref=ref_" not in str(second.conversation.data())
    assert second.stored and all(s.ref.startswith("other_") for s in second.stored)
