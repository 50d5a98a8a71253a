"""Properties every step and every chain keep, over random conversations (design D1).

Random conversations have parallel tool calls, pinned messages, huge tool outputs, CJK, empty
and None contents, content arrays, system and developer messages in the middle. For every
registered step and for chains of random subsets of them:

- the output passes `invariants.check` (design D1.1-D1.5);
- the chain fits the budget whenever the irreducible part does;
- the same input gives the same output;
- a chain's output, once under the trigger, is left alone by a second run (idempotent);
- a message keeps its uid only while its data is the client message's own (the wire adapters
  render such a message as the client sent it, without comparing the two).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import Budget, Conversation, build_policy, check, run_chain
from policies.registry import STEPS, build_step
from policies.rollup import anchored
from tests.policy_strategies import FakeSummaries, budgets, conversations, env

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
STEP_TYPES = sorted(STEPS)
summary_sources = st.sampled_from(["ready", "missing", "failed"])


def irreducible(conversation: Conversation) -> int:
    """What no step may remove: system/developer prompts, pinned messages with their tool groups
    (a pinned call keeps its results), the latest user message."""
    keep = set(anchored(conversation))
    latest = conversation.latest_user_index()
    if latest is not None:
        keep.add(latest)
    return sum(conversation.messages[i].tokens for i in keep)


@SETTINGS
@given(
    conversation=conversations(),
    budget=budgets,
    step_type=st.sampled_from(STEP_TYPES),
    status=summary_sources,
)
def test_every_step_keeps_the_invariants(
    conversation: Conversation, budget: Budget, step_type: str, status: str
) -> None:
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls())
    result = step.apply(conversation, budget, env(FakeSummaries(status)))
    assert check(conversation, result.conversation) == []
    again = step.apply(conversation, budget, env(FakeSummaries(status)))
    assert again.conversation == result.conversation
    assert [s.ref for s in again.stored] == [s.ref for s in result.stored]


# Any chain of up to four steps, on any conversation and budget, with any summary source.
CHAINS = given(
    conversation=conversations(),
    budget=budgets,
    chosen=st.lists(st.sampled_from(STEP_TYPES), min_size=0, max_size=4),
    status=summary_sources,
)


@SETTINGS
@CHAINS
def test_chains_keep_invariants_fit_and_are_deterministic_and_idempotent(
    conversation: Conversation, budget: Budget, chosen: list[str], status: str
) -> None:
    policy = build_policy("p", [{"type": t} for t in chosen] if chosen else None)
    result = run_chain(conversation, budget, policy, env(FakeSummaries(status)))
    truncated = result.recovery == "truncate"
    violations = check(conversation, result.conversation, allow_truncated=truncated)
    assert violations == []
    if irreducible(conversation) <= budget.limit:
        assert result.fits, (result.tokens_after, budget.limit, result.error)
    same = run_chain(conversation, budget, policy, env(FakeSummaries(status)))
    assert same.conversation == result.conversation
    assert same.steps == result.steps
    if result.tokens_after <= budget.trigger:
        twice = run_chain(result.conversation, budget, policy, env(FakeSummaries(status)))
        assert twice.conversation == result.conversation
        assert not twice.changed


@SETTINGS
@CHAINS
def test_a_message_a_chain_changed_or_made_has_no_uid(
    conversation: Conversation, budget: Budget, chosen: list[str], status: str
) -> None:
    """Equal uids mean equal data: a step that changes a message must drop its uid, or the
    adapters would forward the client's message in place of the change."""
    seen = Conversation(
        tuple(replace(m, uid=1000 + i) for i, m in enumerate(conversation.messages))
    )
    policy = build_policy("p", [{"type": t} for t in chosen] if chosen else None)
    result = run_chain(seen, budget, policy, env(FakeSummaries(status)), force=True)
    for message in result.conversation.messages:
        if message.uid is None:
            continue
        assert message.origin >= 0
        original = seen.messages[message.origin]
        assert message.uid == original.uid
        assert message.data == original.data
