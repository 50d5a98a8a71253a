"""`summarize_old` (design D5.7): the oldest 60 % of Turns, a ~300-token summary."""

from __future__ import annotations

from policies import build_policy, check, run_chain
from policies.steps.summarize_old import SummarizeOld, SummarizeOldConfig
from tests.policy_strategies import FakeSummaries, budget, chat, conv, env


def test_defaults_are_the_documented_ones() -> None:
    config = SummarizeOldConfig()
    assert (config.old_threshold, config.summary_length, config.placement) == (0.6, 300, "system")


def test_oldest_sixty_percent_of_turns_become_one_summary() -> None:
    conversation = conv(chat(10, words=60))  # ~1600 tokens, trigger 1440
    source = FakeSummaries()
    result = SummarizeOld(SummarizeOldConfig()).apply(conversation, budget(1800), env(source))
    out = result.conversation.messages
    assert out[0] == conversation.messages[0]
    assert out[1].role == "system" and out[1].text.startswith("[Earlier conversation summary: ")
    kept_turns = [m for m in out if m.role == "user"]
    assert len(kept_turns) == 10 - 6  # floor(10 * 0.6) Turns summarised
    assert out[2:] == conversation.messages[-8:]
    assert all(r.max_tokens == 300 and "300 tokens" in r.instructions for r in source.requests)
    assert check(conversation, result.conversation) == []


def test_under_the_trigger_nothing_happens() -> None:
    conversation = conv(chat(4))
    result = SummarizeOld(SummarizeOldConfig()).apply(conversation, budget(100_000), env())
    assert result.conversation is conversation


def test_pinned_messages_are_not_summarised_away() -> None:
    conversation = conv(chat(10, words=60), pins=[3])
    result = SummarizeOld(SummarizeOldConfig()).apply(conversation, budget(1800), env())
    assert conversation.messages[3] in result.conversation.messages
    assert check(conversation, result.conversation) == []


def test_a_later_fifo_trims_the_turns_after_the_summary_not_the_summary() -> None:
    # 20 Turns of ~200 tokens: summarising the oldest 60 % leaves ~1600, over the trigger
    # (1440), so fifo runs next. It drops the oldest Turns *after* the summary.
    conversation = conv(chat(20, words=60))
    policy = build_policy("p", [{"type": "summarize_old"}, {"type": "fifo"}])
    result = run_chain(conversation, budget(1800), policy, env(FakeSummaries()))
    assert result.changed_steps() == ["summarize_old", "fifo"]
    out = result.conversation.messages
    assert out[0] == conversation.messages[0]
    assert out[1].kind == "summary:summarize_old"
    assert out[2:] == conversation.messages[-len(out) + 2 :]  # then the newest Turns, whole
    assert out[2].role == "user"
    assert result.tokens_after <= budget(1800).trigger
    assert check(conversation, result.conversation) == []


def test_a_later_sliding_window_also_keeps_the_summary() -> None:
    # The same history through summarize_old -> sliding_window: the window slides over the
    # Turns after the summary; the summary (standing for everything before it) stays.
    conversation = conv(chat(20, words=60))
    policy = build_policy("p", [{"type": "summarize_old"}, {"type": "sliding_window"}])
    result = run_chain(conversation, budget(1800), policy, env(FakeSummaries()))
    assert result.changed_steps() == ["summarize_old", "sliding_window"]
    out = result.conversation.messages
    assert out[1].kind == "summary:summarize_old"
    assert out[2:] == conversation.messages[-len(out) + 2 :]
    assert result.tokens_after <= budget(1800).trigger
    assert check(conversation, result.conversation) == []
