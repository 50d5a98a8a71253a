"""`compaction`: retain + summary + the last Turns, cache-stable between events (design D5.7)."""

from __future__ import annotations

from policies import check, run_chain
from policies.invariants import check_tool_pairs
from policies.registry import build_policy
from policies.steps.compaction import Compaction, CompactionConfig
from policies.summaries import prepare_for_summary
from tests.policy_strategies import (
    FakeSummaries,
    assistant_calls,
    budget,
    chat,
    conv,
    env,
    msg,
    prefix_changes,
    tool,
)

WINDOW = budget(3000)


def compaction(**config: object) -> Compaction:
    return Compaction(CompactionConfig(**config))


def test_defaults_are_the_documented_ones() -> None:
    config = CompactionConfig()
    assert config.threshold_ratio == 0.8 and config.retain_last_turns == 1
    assert "<summary>" in config.summary_prompt
    assert config.retain_prompt is None and config.model is None
    assert config.placement == "user"


def test_under_threshold_nothing_happens() -> None:
    conversation = conv(chat(10))
    assert compaction().apply(conversation, WINDOW, env()).conversation is conversation


def test_checkpoint_3_history_becomes_summary_plus_last_turn() -> None:
    conversation = conv(chat(30))
    source = FakeSummaries()
    result = compaction().apply(conversation, WINDOW, env(source))
    out = result.conversation.messages
    assert out[0] == conversation.messages[0]
    assert out[1].role == "user" and out[1].text.startswith("[Earlier conversation summary: ")
    # the Turns after the last event, verbatim: at least the last one (`retain_last_turns`)
    kept = out[2:]
    assert kept[0].role == "user" and len(kept) >= 2
    assert kept == conversation.messages[-len(kept) :]
    assert result.summary_used and check(conversation, result.conversation) == []
    assert all(r.purpose == "compaction" and r.retain_instructions is None for r in source.requests)


def test_retain_directives_model_and_placement() -> None:
    conversation = conv(chat(30))
    source = FakeSummaries()
    step = compaction(
        summary_directives=["Keep every file path"],
        retain_prompt="List what must be kept in <retain> tags.",
        retain_directives=["tool output refs"],
        model="cheap-model",
        retain_last_turns=2,
    )
    result = step.apply(conversation, WINDOW, env(source))
    request = source.requests[0]
    assert request.instructions.endswith("\n- Keep every file path")
    assert (
        request.retain_instructions
        == "List what must be kept in <retain> tags.\n- tool output refs"
    )
    assert request.model == "cheap-model"
    out = result.conversation.messages
    assert (
        out[1].role == "user"
        and out[1].text == "[Retained from the earlier conversation: keep ref_1]"
    )
    assert out[2].text.startswith("[Earlier conversation summary: ")
    kept = out[3:]
    assert kept[0].role == "user" and len(kept) >= 4  # at least two Turns kept
    assert kept == conversation.messages[-len(kept) :]
    if len(source.requests) > 1:  # later links carry the retain part in `previous`
        assert source.requests[1].previous.startswith("<retain>\nkeep ref_1\n</retain>\n<summary>")
    system = compaction(placement="system").apply(conversation, WINDOW, env())
    assert system.conversation.messages[1].role == "system"


def test_retain_directives_alone_use_the_default_retain_prompt() -> None:
    config = CompactionConfig(retain_directives=["refs"])
    assert config.retain_instructions().endswith("\n- refs")
    assert "<retain>" in config.retain_instructions()


def test_checkpoint_4_trailing_tool_calls_break_summarisation_unless_stripped() -> None:
    history = [
        msg("user", "read the file"),
        assistant_calls("c1"),
        tool("c1", "contents"),
        {**assistant_calls("c2"), "content": "Now the other one."},
    ]
    assert check_tool_pairs(history) != []  # as sent to a summariser, the provider rejects it
    prepared = prepare_for_summary(tuple(history))
    assert check_tool_pairs(prepared) == []
    assert prepared[-1] == {"role": "assistant", "content": "Now the other one."}
    without_text = prepare_for_summary(tuple([*history[:-1], assistant_calls("c2")]))
    assert check_tool_pairs(without_text) == [] and len(without_text) == 3


def test_summary_requests_never_carry_dangling_tool_calls() -> None:
    # A client bug: an assistant tool call left without results at the end of an old Turn.
    data = [msg("system", "s")]
    for t in range(12):
        data += [msg("user", f"q{t} " + "w " * 400), assistant_calls(f"x{t}", content="calling")]
    data += [msg("user", "last question")]
    conversation = conv(data)
    source = FakeSummaries()
    compaction().apply(conversation, WINDOW, env(source))
    assert source.requests
    for request in source.requests:
        assert check_tool_pairs(request.messages) == []


def test_compacted_prefix_is_stable_between_events() -> None:
    data = chat(120, words=30)
    policy = build_policy("c", [{"type": "compaction"}])
    stable, events = prefix_changes(
        run_chain(conv(data[:end]), WINDOW, policy, env()).conversation.data()
        for end in range(3, len(data), 2)
    )
    assert events >= 2 and stable > 4 * events
