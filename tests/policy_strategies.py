"""Builders, fakes and Hypothesis strategies for the policy tests.

`count` is the fake token counter every policy test uses: 4 tokens of overhead per message plus
a quarter of the characters of its text and tool calls (deterministic, roughly tiktoken-shaped).
`FakeSummaries` answers every summary request with a short deterministic text (or `missing` /
`failed`) and records what it was asked.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from hypothesis import strategies as st

from policies import Budget, Conversation, Env, Message
from policies.conversation import content_text
from policies.summaries import SummaryAnswer, SummaryRequest


def count(data: Mapping[str, Any]) -> int:
    text = content_text(data.get("content"))
    calls = data.get("tool_calls")
    extra = len(orjson.dumps(calls)) if calls else 0
    return 4 + (len(text) + extra + 3) // 4


def ref_for(text: str) -> str:
    return "ref_" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class FakeSummaries:
    """Deterministic summaries: `ready` texts naming how many messages they cover (in append mode,
    only the new ones; else the new ones and those the previous summary covers)."""

    def __init__(self, status: str = "ready", words: int = 8) -> None:
        self.status = status
        self.words = words
        self.requests: list[SummaryRequest] = []

    def get(self, request: SummaryRequest) -> SummaryAnswer:
        self.requests.append(request)
        if self.status != "ready":
            return SummaryAnswer(self.status)  # type: ignore[arg-type]
        digest = hashlib.sha256(request.canonical()).hexdigest()[:8]
        covered = len(request.messages)
        if not request.append:  # appended: a summary of the new messages only
            covered += sum(int(n) for n in re.findall(r"covers (\d+)", request.previous or ""))
        text = f"covers {covered} messages ({digest})" + " etc" * self.words
        retain = "keep ref_1" if request.retain_instructions else ""
        return SummaryAnswer.ready(text, retain)


def env(summaries: Any = None, **kwargs: Any) -> Env:
    return Env(
        count=count,
        summaries=summaries if summaries is not None else FakeSummaries(),
        ref_for=ref_for,
        **kwargs,
    )


def msg(role: str, content: Any = "", **fields: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **fields}


def call(call_id: str, name: str = "read_file", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_calls(*ids: str, name: str = "read_file", content: Any = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": [call(i, name) for i in ids]}


def tool(call_id: str, content: Any, **fields: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content, **fields}


def conv(
    datas: Sequence[Mapping[str, Any]],
    *,
    pins: Sequence[int] = (),
    priorities: Mapping[int, int] | None = None,
    kinds: Mapping[int, str] | None = None,
) -> Conversation:
    priorities = priorities or {}
    kinds = kinds or {}
    return Conversation(
        tuple(
            Message(
                data=dict(d),
                tokens=count(d),
                pin=i in pins,
                priority=priorities.get(i),
                kind=kinds.get(i),
                origin=i,
            )
            for i, d in enumerate(datas)
        )
    )


def prefix_changes(sent: Iterable[list[Any]]) -> tuple[int, int]:
    """Over successive requests' forwarded messages: how many start with the previous
    request's (the cached prefix holds) and how many do not (an event moved the cut)."""
    previous = None
    stable = events = 0
    for messages in sent:
        if previous is not None:
            if messages[: len(previous)] == previous:
                stable += 1
            else:
                events += 1
        previous = messages
    return stable, events


def budget(window: int, *, reserved: int = 0, fixed: int = 0, trigger=0.8, target=0.6) -> Budget:
    return Budget(
        context_window=window,
        reserved_output=reserved,
        fixed_tokens=fixed,
        trigger_ratio=trigger,
        target_ratio=target,
    )


def chat(turns: int, words: int = 40, system: str = "You are helpful.") -> list[dict[str, Any]]:
    """A plain chat: system + `turns` user/assistant pairs, each about `words` words."""
    out = [msg("system", system)]
    for t in range(turns):
        out.append(msg("user", f"question {t} " + "about things " * (words // 2)))
        out.append(msg("assistant", f"answer {t} " + "with details " * (words // 2)))
    return out


def agent(rounds: int, output_lines: int = 50, task: str = "Fix the failing test") -> list[dict]:
    """An agent session: one user task, then `rounds` tool rounds with biggish outputs."""
    out = [msg("system", "You are a coding agent."), msg("user", task)]
    for r in range(rounds):
        out.append(assistant_calls(f"call_{r}"))
        body = "\n".join(f"{r}:{i} some output line with content" for i in range(output_lines))
        out.append(tool(f"call_{r}", body))
    out.append(msg("assistant", "Done."))
    return out


# Hypothesis ------------------------------------------------------------------------------------

WORDS = st.sampled_from(
    [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "error",
        "test",
        "file",
        "plan",
        "数据",
        "検索",
        "ログ",
        "λ",
    ]
)


@st.composite
def texts(draw: st.DrawFn, big: bool = False) -> Any:
    kind = draw(
        st.sampled_from(["words", "empty", "none", "parts", "lines"] + (["huge"] if big else []))
    )
    if kind == "empty":
        return ""
    if kind == "none":
        return None
    words = draw(st.lists(WORDS, min_size=1, max_size=30))
    text = " ".join(words)
    if kind == "parts":
        return [{"type": "text", "text": text}, {"type": "text", "text": text[::-1]}]
    if kind == "lines":
        n = draw(st.integers(1, 80))
        return "\n".join(f"{i} {text}" for i in range(n))
    if kind == "huge":
        n = draw(st.integers(200, 3000))
        return "\n".join(f"2024-01-01 00:00:{i % 60:02d} INFO line {i} {text}" for i in range(n))
    return text


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    datas: list[dict[str, Any]] = []
    if draw(st.booleans()):
        datas.append(msg(draw(st.sampled_from(["system", "developer"])), draw(texts()) or "sys"))
    call_no = 0
    for _ in range(draw(st.integers(1, 14))):
        block = draw(st.sampled_from(["user", "user", "assistant", "tools", "tools", "system"]))
        if block == "user":
            datas.append(msg("user", draw(texts())))
        elif block == "assistant":
            datas.append(msg("assistant", draw(texts())))
        elif block == "system":
            datas.append(msg(draw(st.sampled_from(["system", "developer"])), draw(texts()) or "x"))
        else:
            n = draw(st.integers(1, 3))
            ids = [f"call_{call_no + k}" for k in range(n)]
            call_no += n
            name = draw(st.sampled_from(["read_file", "run", "tool_output_cache"]))
            datas.append(
                assistant_calls(*ids, name=name, content=draw(st.sampled_from([None, "ok"])))
            )
            for call_id in ids:
                datas.append(tool(call_id, draw(texts(big=True))))
    if draw(st.booleans()):
        datas.append(msg("user", draw(texts())))
    pins = draw(st.sets(st.integers(0, len(datas) - 1), max_size=2))
    priorities = draw(
        st.dictionaries(st.integers(0, len(datas) - 1), st.integers(1, 3), max_size=3)
    )
    kinds = draw(
        st.dictionaries(
            st.integers(0, len(datas) - 1),
            st.sampled_from(["message", "code", "plan_ref", "log", "other"]),
            max_size=3,
        )
    )
    return conv(datas, pins=sorted(pins), priorities=priorities, kinds=kinds)


budgets = st.builds(
    lambda window, fixed: budget(window, reserved=window // 5, fixed=fixed),
    st.integers(200, 30_000),
    st.integers(0, 100),
)
