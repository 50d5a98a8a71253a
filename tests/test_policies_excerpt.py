"""`excerpt` (design D5.13) and `policies.excerpts`: no whole-message cliff.

Properties: an excerpt keeps its head bytes (and tail) verbatim and its ref holds exactly the
rest (expanding every note gives the text back, byte for byte); every fenced block keeps a part;
the step keeps the invariants of D1, never touches the latest user message, is deterministic,
lands near the target, and leaves an earlier excerpt alone while appended messages stay under
the trigger (design D3.1).
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from policies import check, run_chain
from policies.excerpts import NOTE_RE, blocks, excerpt, is_excerpt
from policies.registry import DEFAULT_STEPS, build_policy
from policies.steps.excerpt import ExcerptConfig, Excerpts
from tests.policy_strategies import assistant_calls, budget, conv, env, msg, ref_for, tool

DEFAULT = build_policy("d", [c.model_dump() for c in DEFAULT_STEPS])
LINE = st.text(
    alphabet=st.sampled_from("abcdefghij ,.:;(){}=_-0123456789数ロλ\t"),
    max_size=90,
)


def count(text: str) -> int:
    return (len(text) + 3) // 4


def expanded(text: str, stored: dict[str, str]) -> str:
    """`text` with every note replaced by what its ref holds (the model reading it all)."""
    out = []
    at = 0
    for match in re.finditer(NOTE_RE.pattern + r"[^\]]*\]", text):
        rest = stored[match.group(1)]
        out += [text[at : match.start()], rest]
        at = match.end()
        # the note ends its line when the rest ended one (a tail or the block's end follows)
        if rest.endswith("\n") and text[at : at + 1] == "\n":
            at += 1
    out.append(text[at:])
    return "".join(out)


@st.composite
def documents(draw: st.DrawFn) -> str:
    """Prose, fenced files (a path line, then the block) and plain runs of lines."""
    parts = []
    for _ in range(draw(st.integers(1, 5))):
        lines = draw(st.lists(LINE, min_size=30, max_size=200))
        kind = draw(st.sampled_from(["plain", "fenced", "prose"]))
        if kind == "fenced":
            parts.append(f"src/f{len(parts)}.py\n```\n" + "\n".join(lines) + "\n```\n")
        elif kind == "prose":
            parts.append("Please keep this sentence whole.\n")
        else:
            parts.append("\n".join(lines) + "\n")
    return "\n".join(parts) + draw(st.sampled_from(["", "\n", "tail without newline"]))


@settings(max_examples=300, deadline=None)
@given(text=documents(), share=st.floats(0, 0.6), floor=st.integers(1, 60))
def test_an_excerpt_keeps_head_and_tail_verbatim_and_its_refs_hold_exactly_the_rest(
    text: str, share: float, floor: int
) -> None:
    cut = excerpt(text, int(count(text) * share), count, ref_for, floor)
    assume(cut is not None)
    assert cut is not None
    stored = {s.ref: s.text for s in cut.stored}
    assert all(ref_for(t) == r for r, t in stored.items())
    assert expanded(cut.text, stored) == text
    assert is_excerpt(cut.text)
    # every cut block keeps a part of itself before its note
    for match in NOTE_RE.finditer(cut.text):
        assert match.start() > 0


@settings(max_examples=100, deadline=None)
@given(files=st.lists(st.integers(30, 400), min_size=2, max_size=6), keep=st.integers(0, 2000))
def test_every_fenced_file_keeps_a_part(files: list[int], keep: int) -> None:
    text = "I have *added these files to the chat* so you can edit them.\n" + "".join(
        f"\nsrc/m{k}.py\n```\n"
        + "\n".join(f"def f{k}_{i}(x):  # line {i}" for i in range(n))
        + "\n```\n"
        for k, n in enumerate(files)
    )
    cut = excerpt(text, keep, count, ref_for, 16)
    out = cut.text if cut else text
    for k in range(len(files)):
        assert f"src/m{k}.py\n```\ndef f{k}_0(x):" in out


def large_session(
    outputs: int, lines: int, tail: int = 0, big_question: bool = False
) -> list[dict[str, Any]]:
    data = [msg("system", "You are a coding agent.")]
    data.append(
        msg(
            "user",
            "Here are the files:\nsrc/a.py\n```\n"
            + "\n".join(f"def a{i}(): return {i}" for i in range(lines))
            + "\n```\nNever change the public API.",
        )
    )
    data.append(msg("assistant", "Ok."))
    for r in range(outputs):
        data.append(msg("user", f"step {r}"))
        data.append(assistant_calls(f"c{r}"))
        body = "\n".join(f"{r}:{i} 2024-01-01 INFO output line {i}" for i in range(lines))
        data.append(tool(f"c{r}", body))
        data.append(msg("assistant", f"done {r}"))
    for t in range(tail):
        data.append(msg("user", f"and {t}"))
        data.append(msg("assistant", "fine"))
    question = "What is in the files?"
    if big_question:  # a log pasted into the latest message: never cut (design D1.3)
        question += "\n" + "\n".join(
            f"2024-01-01 ERROR failure {i} in worker" for i in range(lines)
        )
    data.append(msg("user", question))
    return data


@settings(max_examples=60, deadline=None)
@given(
    outputs=st.integers(1, 8),
    lines=st.integers(100, 400),
    fraction=st.floats(0.15, 0.9),
    min_tokens=st.sampled_from([64, 400, 800]),
    big_question=st.booleans(),
)
def test_the_step_keeps_the_invariants_and_the_latest_message_and_is_deterministic(
    outputs: int, lines: int, fraction: float, min_tokens: int, big_question: bool
) -> None:
    conversation = conv(large_session(outputs, lines, big_question=big_question))
    limits = budget(int(conversation.tokens * fraction / 0.6))
    step = Excerpts(ExcerptConfig(min_tokens=min_tokens))
    first = step.apply(conversation, limits, env())
    again = step.apply(conversation, limits, env())
    assert first.conversation == again.conversation and first.stored == again.stored
    result = first.conversation
    assert check(conversation, result) == []
    assert result.messages[-1].data == conversation.messages[-1].data
    stored = {s.ref: s.text for s in first.stored}
    for before, after in zip(conversation.messages, result.messages, strict=True):
        if after.text != before.text:
            assert before.tokens >= min_tokens
            assert expanded(after.text, stored) == before.text
    if first.stored:  # something was cut: it was over the trigger, and it shrank
        assert conversation.tokens > limits.trigger
        assert result.tokens < conversation.tokens


def test_the_step_lands_near_the_target_and_every_file_keeps_a_part() -> None:
    """The event happens at the last message (a long question pushes the total over the
    trigger): the cut lands there, at `aim` of the target, not far below it."""
    data = large_session(outputs=4, lines=300)
    data[-1] = msg("user", "What is in the files? " + "Please be thorough. " * 80)
    conversation = conv(data)
    trigger = conversation.tokens - conversation.messages[-1].tokens // 2
    limits = budget(int(trigger / 0.8) + 1)
    result = Excerpts(ExcerptConfig()).apply(conversation, limits, env()).conversation
    assert 0.7 * limits.target <= result.tokens <= limits.target
    assert "src/a.py\n```\ndef a0(): return 0" in result.messages[1].text
    assert result.messages[1].text.endswith("Never change the public API.")  # prose whole


def test_an_events_second_pass_cuts_to_aim_of_the_events_target_not_of_a_band_lower() -> None:
    """In an event's second pass (design D3.2) the budget is a band lower; the excerpt still
    lands at `aim` of the event's own target, not at `aim` of the lower one (half the target)."""
    data = large_session(outputs=4, lines=300)
    data[-1] = msg("user", "What is in the files? " + "Please be thorough. " * 80)
    conversation = conv(data)
    event = budget(int(conversation.tokens / 0.7))  # between the event's target and trigger
    assert event.target < conversation.tokens <= event.trigger
    second = event.at_event()
    assert second.trigger == event.target
    result = Excerpts(ExcerptConfig()).apply(conversation, second, env()).conversation
    assert 0.7 * event.target <= result.tokens <= event.target


@settings(max_examples=40, deadline=None)
@given(extra=st.integers(0, 12))
def test_appending_under_the_trigger_leaves_earlier_excerpts_alone(extra: int) -> None:
    """Stable partial cut (D3.1): an excerpt is a function of the conversation's prefix, so
    between events a message renders the same bytes."""
    base = large_session(outputs=5, lines=200)
    conversation = conv(base)
    limits = budget(int(conversation.tokens * 0.5 / 0.6))
    step = Excerpts(ExcerptConfig())
    first = step.apply(conversation, limits, env()).conversation
    grown = base[:-1] + [
        m for t in range(extra) for m in (msg("user", f"q{t}"), msg("assistant", "a"))
    ]
    grown.append(base[-1])
    bigger = step.apply(conv(grown), limits, env()).conversation
    room = limits.trigger - first.tokens
    if bigger.tokens - first.tokens < room:  # still under the trigger: no new event
        assert bigger.messages[: len(base) - 1] == first.messages[: len(base) - 1]


def test_the_default_chain_cuts_a_large_old_message_instead_of_dropping_it() -> None:
    data = large_session(outputs=0, lines=600, tail=6)
    conversation = conv(data)
    limits = budget(int(conversation.tokens * 0.5 / 0.6))
    result = run_chain(conversation, limits, DEFAULT, env())
    assert check(conversation, result.conversation) == []
    texts = [m.text for m in result.conversation.messages]
    [files] = [t for t in texts if t.startswith("Here are the files:")]
    assert is_excerpt(files) and "def a0(): return 0" in files
    assert result.stored and "excerpt" in result.changed_steps()
    assert len(blocks(data[1]["content"])) == 1
