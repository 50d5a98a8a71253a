"""`sandwich` (design D5.6): its defaults, the kept top and bottom, the summarised middle, a
cached summary reused and extended, and a failed summary left to the next step."""

from __future__ import annotations

from policies import check, run_chain
from policies.conversation import Conversation
from policies.registry import build_policy
from policies.steps.sandwich import SANDWICH_PROMPT, Sandwich, SandwichConfig
from policies.summaries import FAILED, DictSummaries, SummaryAnswer
from tests.policy_strategies import (
    FakeSummaries,
    agent,
    assistant_calls,
    budget,
    chat,
    conv,
    env,
    msg,
    tool,
)

WINDOW = budget(3000)  # limit 3000; sandwich threshold 2100


def sandwich(**config: object) -> Sandwich:
    return Sandwich(SandwichConfig(**config))


def test_defaults_are_the_documented_ones() -> None:
    config = SandwichConfig()
    assert (config.preserve_top, config.preserve_bottom, config.compression_threshold) == (
        5,
        5,
        0.7,
    )
    assert config.placement == "system"
    assert config.prompt == SANDWICH_PROMPT
    assert "Key facts and decisions made" in config.prompt


def test_under_threshold_returns_full_history() -> None:
    conversation = conv(chat(8))  # ~ 800 tokens
    result = sandwich().apply(conversation, WINDOW, env())
    assert result.conversation is conversation
    chained = run_chain(conversation, WINDOW, build_policy("s", [{"type": "sandwich"}]), env())
    assert chained.conversation is conversation and not chained.triggered


def test_not_enough_messages_returns_full_history() -> None:
    data = [msg("system", "s")] + [
        msg("user" if i % 2 == 0 else "assistant", "w " * 3000) for i in range(10)
    ]
    conversation = conv(data)
    result = sandwich().apply(conversation, WINDOW, env())
    assert result.conversation is conversation


def test_over_threshold_summarises_the_middle() -> None:
    conversation = conv(chat(30))
    source = FakeSummaries()
    result = sandwich().apply(conversation, WINDOW, env(source))
    out = result.conversation.messages
    assert result.summary_used and result.conversation.tokens < conversation.tokens  # summarised
    assert out[:6] == conversation.messages[:6]  # head + top 5
    assert out[-5:] == conversation.messages[-5:]  # bottom 5
    summary = out[6]  # a system message right after the top
    assert summary.role == "system" and summary.origin == -1
    assert summary.text.startswith("[Earlier conversation summary: covers ")
    assert all(
        r.instructions == SANDWICH_PROMPT and r.purpose == "sandwich" for r in source.requests
    )
    assert all(r.max_tokens == 1000 for r in source.requests)
    assert check(conversation, result.conversation) == []


def test_cut_points_never_split_a_tool_group() -> None:
    data = [msg("system", "s"), msg("user", "task")]
    for r in range(40):
        data += [
            assistant_calls(f"a{r}", f"b{r}"),
            tool(f"a{r}", "out " * 60),
            tool(f"b{r}", "out " * 60),
        ]
    data.append(msg("assistant", "done"))
    conversation = conv(data)
    result = sandwich(preserve_top=2, preserve_bottom=2).apply(conversation, WINDOW, env())
    assert result.summary_used
    assert check(conversation, result.conversation) == []
    out = result.conversation.messages
    assert out[1:4] == conversation.messages[1:4]  # top grew to the end of the group
    assert len([m for m in out if m.origin > 4]) >= 2


def test_cached_summary_reused_while_the_middle_is_unchanged() -> None:
    source = DictSummaries()
    data = chat(30)
    conversation = conv(data)
    step = sandwich()
    first = step.apply(conversation, WINDOW, env(source))
    assert first.conversation is conversation and len(first.pending) == 1  # missing: unchanged
    for key, request in list(source.missing.items()):
        source.answers[key] = SummaryAnswer.ready(f"S({len(request.messages)})")
    ready = step.apply(conversation, WINDOW, env(source))
    while ready.pending:  # a long first range comes in several links
        for key, request in list(source.missing.items()):
            source.answers[key] = SummaryAnswer.ready(f"S({len(request.messages)})")
        ready = step.apply(conversation, WINDOW, env(source))
    assert ready.summary_used
    asked = set(source.answers)
    # one more short exchange: the middle does not move, the same summary is reused
    grown = conv([*data, msg("user", "ok?"), msg("assistant", "ok.")])
    again = step.apply(grown, WINDOW, env(source))
    assert again.summary_used and not again.pending and set(source.answers) == asked
    prefix = ready.conversation.data()[:-1]
    assert again.conversation.data()[: len(prefix)] == prefix


def test_middle_growth_asks_for_an_extension_of_the_cached_summary() -> None:
    source = FakeSummaries()
    data = chat(30)
    step = sandwich()
    before = step.apply(conv(data), WINDOW, env(source))
    old_summary = next(m.text for m in before.conversation.messages if m.origin == -1)
    more = data + [
        m
        for t in range(6)
        for m in (msg("user", f"q{t} " + "x " * 80), msg("assistant", "y " * 80))
    ]
    asked = list(source.requests)
    pending = DictSummaries({r.canonical(): source.get(r) for r in asked})
    grown = step.apply(conv(more), WINDOW, env(pending))
    assert len(grown.pending) == 1
    request = grown.pending[0]
    assert request.previous is not None  # extends the summary of the earlier links
    # while the new link is missing, the older ready links are still used (never corrupted)
    assert grown.summary_used and grown.detail["summary"].startswith("partial")
    assert old_summary.startswith("[Earlier conversation summary: ")


def test_failed_summary_leaves_the_request_to_the_next_step() -> None:
    conversation = conv(chat(30))
    failing = DictSummaries()
    failing.get = lambda request: FAILED  # type: ignore[method-assign]
    result = sandwich().apply(conversation, WINDOW, env(failing))
    assert result.conversation is conversation and not result.pending
    chained = run_chain(
        conversation,
        WINDOW,
        build_policy("p", [{"type": "sandwich"}, {"type": "fifo"}]),
        env(failing),
    )
    assert chained.fits and "fifo" in chained.changed_steps()


def test_placements() -> None:
    conversation = conv(chat(30))
    user = sandwich(placement="user").apply(conversation, WINDOW, env())
    assert user.conversation.messages[6].role == "user"
    appended = sandwich(placement="system_append").apply(conversation, WINDOW, env())
    first = appended.conversation.messages[0]
    assert first.text.startswith("You are helpful.\n\n[Earlier conversation summary: ")
    assert check(conversation, appended.conversation) == []
    custom = sandwich(template="<summary>{summary}</summary>").apply(conversation, WINDOW, env())
    assert custom.conversation.messages[6].text.startswith("<summary>covers")


def test_agent_turn_keeps_the_task_and_the_latest_rounds() -> None:
    conversation: Conversation = conv(agent(40, output_lines=20))
    result = sandwich().apply(conversation, WINDOW, env())
    assert result.summary_used
    assert result.conversation.messages[1] == conversation.messages[1]  # the task (latest user)
    assert check(conversation, result.conversation) == []
