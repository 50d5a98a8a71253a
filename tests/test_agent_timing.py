"""The rules behind answering agents' compactions, without a gateway: the uncovered tail written
short (`gateway.agents.tail`), when the next compaction comes (`gateway.agents.timing`), and
whether summaries made ahead pay for a conversation (`gateway.agents.payback`)."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agents.payback import MAX_PER_CYCLE, Payback
from gateway.agents.tail import RESULT_CHARS, render_tail, tail_share, with_tail
from gateway.agents.timing import CompactionTiming
from gateway.summaries.transcript import render_message

# -- the tail ---------------------------------------------------------------------------------

_line = st.text(st.characters(codec="utf-8", exclude_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85"))
_lines = st.lists(_line.map(lambda s: s[:200]), min_size=0, max_size=400)


@st.composite
def steps(draw: Any) -> list[dict[str, Any]]:
    """Agent steps as canonical messages: the model's text or tool calls, the tools' results,
    now and then a user's words."""
    messages: list[dict[str, Any]] = []
    for index in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["call", "call", "text", "user"]))
        if kind == "call":
            arguments = draw(st.text(max_size=2000))
            call = {"id": f"call_{index}", "type": "function"}
            call["function"] = {"name": f"tool{index}", "arguments": arguments}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            output = "\n".join(draw(_lines))
            messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": output})
        else:
            role = "assistant" if kind == "text" else "user"
            messages.append({"role": role, "content": draw(st.text(max_size=9000))})
    return messages


@settings(max_examples=150, deadline=None)
@given(messages=steps())
def test_the_tail_keeps_every_step_in_order_and_is_never_longer_than_the_steps(
    messages: list[dict[str, Any]],
) -> None:
    written = render_tail(messages)
    verbatim = "\n\n".join(render_message(m) for m in messages)
    assert len(written) <= len(verbatim)
    # Every message keeps its role line, every call its name and id, in the history's order.
    labels = [
        f"[tool result for {m['tool_call_id']}]" if m["role"] == "tool" else f"[{m['role']}]"
        for m in messages
    ]
    at = 0
    for label in labels:
        found = written.find(label, at)
        assert found >= 0, label
        at = found + len(label)
    for message in messages:
        for call in message.get("tool_calls") or ():
            assert f"-> calls {call['function']['name']} ({call['id']})" in written
    assert 0.0 <= tail_share(messages) <= 1.0


@settings(max_examples=100, deadline=None)
@given(lines=_lines, first=st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=30))
def test_a_long_tool_result_keeps_its_first_and_last_lines(lines: list[str], first: str) -> None:
    output = "\n".join([first, *lines, "the last line"])
    message = {"role": "tool", "tool_call_id": "c1", "content": output}
    written = render_tail([message])
    body = written.split("\n", 1)[1]
    if len(output) <= RESULT_CHARS and output.count("\n") < 16:
        assert body == output  # short: verbatim
        return
    assert len(body) <= max(len(output), RESULT_CHARS + 200)
    assert body.startswith(output[: min(len(first), 200)])
    assert body.endswith("the last line") or body.endswith(output[-10:])


def test_a_short_step_is_written_out_verbatim_after_the_summary() -> None:
    messages = [
        {"role": "assistant", "content": "Looking at the parser."},
        {"role": "user", "content": "Use the new API only."},
    ]
    answer = with_tail("<summary>S</summary>", messages)
    assert answer.startswith("<summary>S</summary>")
    assert answer.endswith("[assistant]\nLooking at the parser.\n\n[user]\nUse the new API only.")
    assert with_tail("S", []) == "S"


def test_a_cut_says_how_much_it_left_out() -> None:
    output = "\n".join(f"row {n}" for n in range(1000))
    written = render_tail([{"role": "tool", "tool_call_id": "c", "content": output}])
    left = re.search(r"\[\.\.\. (\d+) lines", written)
    assert left is not None and int(left.group(1)) == 1000 - 16
    assert "row 0\n" in written and written.endswith("row 999")


# -- when the next compaction comes ---------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    base=st.integers(500, 20_000),
    growth=st.integers(200, 8_000),
    limit_over=st.integers(1, 60_000),
    cycles=st.integers(2, 5),
    codex=st.booleans(),
)
def test_the_summary_is_due_exactly_at_the_request_before_each_compaction(
    base: int, growth: int, limit_over: int, cycles: int, codex: bool
) -> None:
    """An agent whose history starts at `base` and grows `growth` per request, compacting at
    its limit, as Codex does (the history it is about to send, the compaction carrying one
    more step) or as Claude Code does (the last request's, the compaction carrying that
    history): after its first compaction, each cycle the summary is due at the last ordinary
    request before the compaction, and only there."""
    limit = base + limit_over
    timing = CompactionTiming()
    for cycle in range(cycles + 1):
        history = base
        due: list[bool] = []
        while True:  # the agent sends a request, and the answer brings one step
            due.append(timing.ordinary("t", "agent", "conv", history))
            checked = history + growth if codex else history
            if checked >= limit:
                timing.compacted("t", "agent", "conv", history + (growth if codex else 30))
                break
            history += growth
        if cycle > 0:  # the first cycle teaches
            assert due == [False] * (len(due) - 1) + [True], (cycle, due)


def test_without_a_bracket_the_summary_is_due_just_under_where_the_agent_compacted() -> None:
    timing = CompactionTiming()
    assert not timing.ordinary("t", "codex", "a", 9_000)  # nothing learnt yet
    timing.compacted("t", "codex", "b", 10_000)  # a compaction first in its conversation
    assert not timing.ordinary("t", "codex", "c", 9_000)  # growth unknown, under the mark
    assert timing.ordinary("t", "codex", "c", 9_600)
    # Another replica's template says where, nothing else: the same mark.
    fresh = CompactionTiming()
    assert fresh.ordinary("t", "codex", "d", 9_600, fallback=10_000)
    assert not fresh.ordinary("t", "codex", "e", 9_000, fallback=10_000)


# -- whether it pays ----------------------------------------------------------------------------


def test_answers_that_save_more_than_the_summaries_cost_keep_them_coming() -> None:
    payback = Payback()
    for _ in range(5):
        assert payback.may_prepare("c")
        payback.made("c", 12_000)
        assert payback.answered("c", 19_000) == 0
    figures = payback.figures("c")
    assert figures["answered"] == 5 and figures["summaries_unused"] == 0
    assert figures["background_tokens"] == 60_000 and figures["saved_tokens"] == 95_000


def test_summaries_that_go_unused_sit_out_one_cycle_then_two() -> None:
    payback = Payback()
    skipped = []
    for _ in range(8):
        if payback.may_prepare("c"):
            payback.made("c", 12_000)
            payback.forwarded("c", "not_ready", 19_000)
            skipped.append(False)
        else:
            assert payback.sitting_out("c")
            payback.forwarded("c", "backoff", 19_000)
            skipped.append(True)
    # Two unused, one sat out; two more, two sat out; then again.
    assert skipped == [False, False, True, False, False, True, True, False]


def test_summaries_that_cost_more_than_they_save_sit_out() -> None:
    payback = Payback()
    for _ in range(MAX_PER_CYCLE):
        assert payback.may_prepare("c")
        payback.made("c", 15_000)
    assert not payback.may_prepare("c")  # at most three in one cycle
    payback.answered("c", 16_000)  # it saved less than the three cost, by more than itself
    assert payback.sitting_out("c") and not payback.may_prepare("c")
    assert payback.figures("c")["summaries_unused"] == 2


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(st.sampled_from(["made", "answered", "stale", "not_ready"]), max_size=12),
    read_at=st.integers(0, 12),
)
def test_books_read_before_this_replicas_last_change_do_not_undo_it(
    steps: list[str], read_at: int
) -> None:
    """Two replicas share a conversation's books through the store; each reads them in the
    background. A read that began before this replica's own later changes landed (the store
    still holds older books) leaves its books as they are; books as new or newer are taken."""
    payback = Payback()
    snapshot = None
    for k, step in enumerate(steps):
        if k == read_at:
            snapshot = payback.books("c")
        if step == "made":
            payback.made("c", 100)
        elif step == "answered":
            payback.answered("c", 500)
        else:
            payback.forwarded("c", step, 500)
    now = payback.books("c")
    if snapshot is not None:
        payback.adopt("c", snapshot)  # the older books, read late
        assert payback.books("c") == now
    if now is not None:
        other = Payback()
        other.adopt("c", now)
        other.made("c", 100)  # another replica moved on from the same books
        payback.adopt("c", other.books("c") or {})
        assert payback.books("c") == other.books("c")
