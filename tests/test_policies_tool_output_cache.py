"""`tool_output_cache` (design D5.1): the view, the tool budget, the fit, and cache stability."""

from __future__ import annotations

from policies import check, run_chain
from policies.registry import build_policy
from policies.steps.tool_output_cache import (
    PLACEHOLDER_RE,
    ToolOutputCache,
    ToolOutputCacheConfig,
)
from tests.policy_strategies import (
    agent,
    assistant_calls,
    budget,
    conv,
    env,
    msg,
    ref_for,
    tool,
)

BIG_WINDOW = budget(1_000_000)


def step(**config: object) -> ToolOutputCache:
    return ToolOutputCache(ToolOutputCacheConfig(**config))


def one_output(content: object, **fields: object):
    return conv(
        [
            msg("system", "sys"),
            msg("user", "go"),
            assistant_calls("c1"),
            tool("c1", content, **fields),
            msg("assistant", "done"),
        ]
    )


def test_defaults_are_the_documented_ones() -> None:
    config = ToolOutputCacheConfig()
    assert config.max_line_length == 2000
    assert config.max_message_bytes == 50 * 1024
    assert config.context_budget_tokens is None
    assert config.tool_budget(40_000) == 20_000  # clamp(10 000, 20 000, 60 000)
    assert config.tool_budget(128_000) == 32_000
    assert config.tool_budget(1_000_000) == 60_000
    assert ToolOutputCacheConfig(context_budget_tokens=5).tool_budget(1_000_000) == 5


def test_long_lines_are_cut_and_the_full_output_is_stored() -> None:
    text = "short line\n" + "x" * 5000 + "\nlast line"
    conversation = one_output(text)
    result = step().apply(conversation, BIG_WINDOW, env())
    view = result.conversation.messages[3].text
    lines = view.split("\n")
    assert lines[0] == "short line"
    assert lines[1] == "x" * 2000 + " [...]"
    assert lines[2] == "last line"
    ref = ref_for(text)
    assert f"ref={ref}" in view and "tool_output_cache" in view
    assert [(s.ref, s.text, s.byte_size, s.line_count) for s in result.stored] == [
        (ref, text, len(text), 3)
    ]
    assert result.replaced == 1
    assert check(conversation, result.conversation) == []


def test_message_cut_at_max_bytes_is_utf8_safe_and_keeps_whole_lines() -> None:
    text = "\n".join(f"{i} 日本語のログ行です" * 4 for i in range(5000))  # ~600 KB
    result = step().apply(one_output(text), BIG_WINDOW, env())
    view = result.conversation.messages[3].text
    assert len(view.encode("utf-8")) <= 51_200
    body = view[: view.index("\n[tool output cut;")]
    assert all(line in text.split("\n") for line in body.split("\n"))
    assert "showing " in view and " of 5000 lines" in view
    assert result.stored[0].text == text


def test_a_single_huge_line_is_cut_inside_the_line_on_a_character_boundary() -> None:
    text = "é" * 100_000
    result = step(max_line_length=1_000_000).apply(one_output(text), BIG_WINDOW, env())
    view = result.conversation.messages[3].text
    assert len(view.encode("utf-8")) <= 51_200
    assert view.startswith("é" * 1000)


def test_outputs_within_limits_are_untouched() -> None:
    conversation = one_output("small output\n" * 10)
    result = step().apply(conversation, BIG_WINDOW, env())
    assert result.conversation is conversation and result.stored == ()


def test_content_arrays_keep_their_shape() -> None:
    parts = [{"type": "text", "text": "y" * 3000}, {"type": "text", "text": "tail"}]
    result = step().apply(one_output(parts), BIG_WINDOW, env())
    content = result.conversation.messages[3].data["content"]
    assert isinstance(content, list) and content[0]["type"] == "text"
    assert content[0]["text"].startswith("y" * 2000 + " [...]\ntail")
    assert result.stored[0].text == "y" * 3000 + "\ntail"


def test_oldest_outputs_are_replaced_when_outputs_exceed_the_tool_budget() -> None:
    data = agent(30, output_lines=50)  # each output ~430 tokens with the fake counter
    conversation = conv(data)
    result = step(context_budget_tokens=3000, fit_budget=False).apply(
        conversation, BIG_WINDOW, env()
    )
    outputs = [m for m in result.conversation.messages if m.role == "tool"]
    trimmed = [m for m in outputs if PLACEHOLDER_RE.match(m.text)]
    assert trimmed and outputs[-1] not in trimmed
    # oldest first: every trimmed output comes before every kept one
    flags = [bool(PLACEHOLDER_RE.match(m.text)) for m in outputs]
    assert flags == sorted(flags, reverse=True)
    assert sum(m.tokens for m in outputs if not PLACEHOLDER_RE.match(m.text)) <= 3000
    for message in trimmed:
        ref = message.text.split("ref=")[1].rstrip("]")
        original = conversation.messages[message.origin].text
        assert ref == ref_for(original)
        assert any(s.ref == ref and s.text == original for s in result.stored)
    assert check(conversation, result.conversation) == []


def test_fit_budget_masks_more_while_the_request_is_over_the_trigger() -> None:
    conversation = conv(agent(30, output_lines=50))
    small = budget(8000)
    only_001 = step(fit_budget=False).apply(conversation, small, env())
    assert only_001.conversation is conversation  # 13k of outputs < the 20k floor
    fitted = step().apply(conversation, small, env())
    assert fitted.conversation.tokens <= small.trigger
    last_group = fitted.conversation.messages[-3:]
    assert not PLACEHOLDER_RE.match(last_group[1].text)  # the newest output is kept


def test_expansion_results_and_pinned_outputs_are_never_masked() -> None:
    body = "line of output\n" * 400
    data = [
        msg("user", "go"),
        assistant_calls("cg_1", name="tool_output_cache"),
        tool("cg_1", body),
        assistant_calls("c2", name="other"),
        tool("c2", body, name="tool_output_cache"),
        assistant_calls("c3", name="tool_output_cache_grep"),
        tool("c3", body),
        assistant_calls("c4"),
        tool("c4", body),
        assistant_calls("c5"),
        tool("c5", body),
        assistant_calls("c6"),
        tool("c6", body),
    ]
    conversation = conv(data, pins=[8])
    result = step(context_budget_tokens=100).apply(conversation, BIG_WINDOW, env())
    texts = [m.text for m in result.conversation.messages]
    assert texts[2] == texts[4] == texts[6] == body  # expansions
    assert texts[8] == body  # pinned
    assert PLACEHOLDER_RE.match(texts[10])


def test_placeholders_and_views_are_recognised_and_never_stored_again() -> None:
    body = "z" * 3000 + "\n" + "line\n" * 3000
    conversation = conv(agent(6, output_lines=400))
    first = step(context_budget_tokens=1500).apply(conversation, BIG_WINDOW, env())
    assert first.stored
    second = step(context_budget_tokens=1500).apply(first.conversation, BIG_WINDOW, env())
    assert second.conversation == first.conversation and second.stored == ()
    two = conv(
        [
            msg("user", "go"),
            assistant_calls("c1"),
            tool("c1", body),
            assistant_calls("c2"),
            tool("c2", "second output " * 100),
        ]
    )
    viewed = step().apply(two, BIG_WINDOW, env())
    assert "[tool output cut; ref=" in viewed.conversation.messages[2].text
    again = step(context_budget_tokens=1).apply(viewed.conversation, BIG_WINDOW, env())
    assert again.conversation.messages[2].text == f"[tool output trimmed; ref={ref_for(body)}]"
    assert again.stored == ()  # the view's ref is read back, not a new one for the view's text


def test_trimmed_set_only_grows_at_events_across_a_growing_session() -> None:
    data = agent(80, output_lines=40)
    policy = build_policy("p", [{"type": "tool_output_cache"}])
    window = budget(12_000)
    previous: list = []
    kept_prefix = events = 0
    for end in range(4, len(data), 2):  # after each tool result
        conversation = conv(data[:end])
        sent = run_chain(conversation, window, policy, env()).conversation.data()
        if previous and sent[: len(previous)] == previous:
            kept_prefix += 1
        elif previous:
            events += 1
        previous = sent
    assert events <= 12 and kept_prefix >= 60


def test_default_chain_leaves_a_request_under_the_trigger_alone() -> None:
    conversation = one_output("x" * 100_000)
    result = run_chain(conversation, BIG_WINDOW, build_policy("d"), env())
    assert not result.triggered and result.conversation is conversation
