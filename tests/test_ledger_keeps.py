"""The ledger takes the room it needs, and only the user's words (design D5.3, issue 40).

Properties over conversations that mix what users type (statements, filler, requests, in three
languages) with what clients send around it (fenced files, logs, data rows, line-numbered reads,
Aider's file and command-output messages): the ledger never makes a request bigger than it
came, never holds a line of material, and every entry is the user's prose word for word; a
statement is only left out when the ledger is full. And the known failure of issue 40: an
Aider request whose ledger copied hundreds of lines of numbers out of the files.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.corpus import sessions
from policies import check, run_chain
from policies.prose import prose_spans
from policies.registry import DEFAULT_STEPS, build_policy
from policies.salience import normalised
from policies.steps.ledger import KIND, LedgerConfig
from tests.policy_strategies import budget, conv, env, msg

DEFAULT = build_policy("d", [c.model_dump() for c in DEFAULT_STEPS])
LEDGER_FIFO = build_policy("lf", [{"type": "ledger"}, {"type": "fifo"}])

STATEMENTS = [
    "Never push to the release branch on a Friday.",
    "The staging database is at 10.1.2.3, port 5433.",
    "We decided to keep the API at v2 until June 30.",
    "oh and the deploy key lives in /etc/app/deploy.pem, don't copy it anywhere",
    "I'd rather have small pull requests.",
    "生产库千万别碰，测试库在 10.9.8.7。",
    "退款超时是 72 小时，不是 48 小时。",
    "本番には触らないでください。検証環境は 10.8.1.30 です。",
    "金額は必ず整数の円で持つこと。",
]
FILLER = [
    "ok",
    "continue",
    "Acknowledged. Continuing with the plan.",
    "好的",
    "了解です",
    "thanks!",
]


def material(kind: str, n: int, seed: int) -> str:
    """Lines no user typed: each distinct (it carries `seed` and its number)."""
    if kind == "csv":
        return "\n".join(f"2024-01-{1 + i % 28:02d},EUR,1.{seed}{i:04d}" for i in range(n))
    if kind == "log":
        return "\n".join(
            f"2024-10-01T12:{i % 60:02d}:00Z ERROR job {seed}-{i} must not retry: timeout after 30 s"
            for i in range(n)
        )
    if kind == "read":
        return "\n".join(
            f"{i + 1:>6}\t    # Never change rate {seed}.{i} without asking" for i in range(n)
        )
    return "\n".join(
        f"    if total_{seed}_{i} > 1000:  # must stay under 1000 ms" for i in range(n)
    )


@st.composite
def mixed_sessions(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[str]]:
    """A session and every line of material in it."""
    data = [msg("system", "You are a coding assistant.")]
    lines: list[str] = []
    for _ in range(draw(st.integers(4, 24))):
        kind = draw(st.sampled_from(["say", "filler", "fenced", "aider", "run", "log", "mixed"]))
        seed = len(data)
        block = material(
            draw(st.sampled_from(["csv", "log", "read", "code"])), draw(st.integers(3, 40)), seed
        )
        said = draw(st.sampled_from(STATEMENTS))
        if kind == "say":
            text = said
        elif kind == "filler":
            text = draw(st.sampled_from(FILLER))
        elif kind == "fenced":
            text = f"Here it is:\n```\n{block}\n```\n{said}"
        elif kind == "aider":
            text = f"I have *added these files to the chat* so you can go ahead and edit them.\n\nsrc/x{seed}.py\n```\n{block}\n```\n"
        elif kind == "run":
            text = f"I ran this command:\n\npytest -q\n\nAnd got this output:\n\n{block}\n"
        elif kind == "log":
            text = f"{said}\n{block}"  # a log pasted without a fence, after a statement
        else:
            text = f"{said}\n\n{block}\n\nAlso: {draw(st.sampled_from(STATEMENTS))}"
        if kind != "say" and kind != "filler":
            lines += [line.strip() for line in block.split("\n")]
        data.append(msg("user", text))
        data.append(msg("assistant", "Done. " * draw(st.integers(1, 60))))
    data.append(msg("user", "continue"))
    return data, lines


def ledger_entries(conversation: Any) -> list[str]:
    found = [m for m in conversation.messages if m.kind == KIND]
    return [line[2:] for line in found[0].text.split("\n")[1:]] if found else []


@settings(max_examples=120, deadline=None)
@given(
    session=mixed_sessions(),
    fraction=st.floats(0.15, 0.9),
    policy=st.sampled_from([DEFAULT, LEDGER_FIFO]),
)
def test_the_ledger_never_grows_a_request_nor_holds_material_and_its_entries_are_user_prose(
    session: tuple[list[dict[str, Any]], list[str]], fraction: float, policy: Any
) -> None:
    data, lines = session
    conversation = conv(data)
    limits = budget(int(conversation.tokens * fraction / 0.6))
    result = run_chain(conversation, limits, policy, env())
    after = result.conversation
    assert check(conversation, after) == []
    assert result.tokens_after <= result.tokens_before  # never bigger than it came
    entries = ledger_entries(after)
    for entry in entries:
        assert not any(len(line) >= 12 and line in entry for line in lines), entry
        key = normalised(entry.rstrip("…"))
        prose = [
            normalised(m["content"][a:b])
            for m in data
            if m["role"] == "user"
            for a, b in prose_spans(m["content"])
        ]
        assert any(key in p for p in prose), entry  # word for word, from the user's prose
    ledger = [m for m in after.messages if m.kind == KIND]
    assert all(m.tokens <= limits.limit * LedgerConfig().share for m in ledger)
    # it stands in for what went, and is no bigger than it: entries come from dropped
    # messages only, and the block costs less than the user messages it stands for
    kept = {m.origin for m in after.messages}
    dropped = [m for m in conversation.messages if m.origin not in kept and m.role == "user"]
    kept_text = normalised("\n".join(m.text for m in after.messages if m.kind != KIND))
    assert not any(normalised(e) in kept_text for e in entries)
    assert sum(m.tokens for m in ledger) <= sum(m.tokens for m in dropped)


@settings(max_examples=60, deadline=None)
@given(session=mixed_sessions(), fraction=st.floats(0.2, 0.9))
def test_a_statement_is_lost_only_when_the_ledger_was_full(
    session: tuple[list[dict[str, Any]], list[str]], fraction: float
) -> None:
    data, _ = session
    conversation = conv(data)
    limits = budget(int(conversation.tokens * fraction / 0.6))
    result = run_chain(conversation, limits, DEFAULT, env())
    text = normalised("\n".join(m.text for m in result.conversation.messages))
    said = {s for m in data if m["role"] == "user" for s in STATEMENTS if s in m["content"]}
    lost = [s for s in said if normalised(s) not in text]
    full = sum(r.detail.get("left_out", 0) for r in result.steps if r.type == "ledger")
    emergency = any(r.type in ("emergency",) or r.type.startswith("recovery") for r in result.steps)
    assert not lost or full or emergency, lost


def test_the_aider_request_of_issue_40_keeps_every_file_and_copies_no_line_of_them() -> None:
    """Repo map and four files as user messages, "What is in these files?", a 40k window: the
    ledger once grew it 38,165 -> 41,716 tokens with 252 lines of numbers from the files, then
    fifo dropped every file."""
    [s] = sessions("dev", 1, ["aider"], ["en"])
    data = list(s.requests())[-1]["messages"]
    conversation = conv(data)
    limits = budget(40_000, reserved=4096)
    result = run_chain(conversation, limits, DEFAULT, env())
    after = result.conversation
    assert check(conversation, after) == []
    assert result.tokens_after <= result.tokens_before
    ledger = [r for r in result.steps if r.type == "ledger" and not r.detail.get("finish")]
    assert all(r.tokens_after - r.tokens_before < 200 for r in ledger)  # a few statements at most
    text = "\n".join(m.text for m in after.messages)
    lines = {
        line.strip() for f in s.files for line in f.text.split("\n") if len(line.strip()) >= 12
    }
    entries = ledger_entries(after)
    assert not any(line in entry for entry in entries for line in lines)
    for f in s.files:
        assert f.probe() in text, f.name  # every file keeps a part
    assert result.tokens_after >= 0.7 * limits.target
    # the ledger on its own, before a fifo that drops the files' Turn whole
    alone = run_chain(conversation, limits, LEDGER_FIFO, env())
    assert alone.tokens_after <= alone.tokens_before
    entries = ledger_entries(alone.conversation)
    assert not any(line in entry for entry in entries for line in lines)  # files are no prose
