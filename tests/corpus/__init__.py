"""An evaluation corpus shaped like the traffic the gateway serves, in three halves.

    from tests.corpus import HALVES, sessions
    for s in sessions("heldout"):
        for body in s.requests(): ...      # every request the client sends, in order

**Which half is which.** `dev.json` is the DEV half: it may be read while tuning the ledger and
`policies/salience.py`. `heldout.json` is the HELD-OUT half: it is judged, never tuned on; a
rule is never changed because of what it does on this half. Both were written before the
salience rules were checked against them. `fresh.json` is the FRESH half (the third "half"):
judged only like the held-out one, and written blind, by someone who had read neither the
rules nor the held-out half, after the rules had been tuned. Every report prints all three.

Each half holds, per language (English, Chinese, Japanese): statements a user types, each with
the items in it that must survive word for word (rules, prohibitions, constraints, decisions,
preferences, goals, corrections, facts: numbers with units, paths, names, dates), in many
phrasings (labelled, plain, casual "oh and ...", hedged, reported, conditional, bulleted, inside
a question); filler turns and acknowledgements; routine requests; the assistant's prose; a
CONTRIBUTING-style page; and a domain vocabulary the code, data files and logs are generated
from (`material`). The halves use different domains, and different code (Python in dev, Go in
held-out, Rust in fresh).

A session is a list of events (`Say`, `Paste`, `Step`, `Reply`) rendered into one client's wire
shape by `shapes`: `aider` (chat; files and a repo map as user messages), `codex` (Responses;
reasoning items with encrypted_content, ~6k-token function_call_output items), `claude_code`
(Messages; system blocks with cache_control, tool_result lists, its cleared-result markers),
`opencode` (chat with tools; OpenCode's or Qwen Code's tool names by seed) and `chat` (plain chat
with pasted logs). Its last user message is a question whose answer depends on named content
(`Session.depends_on`): a planted statement, the files added to the chat, a tool output or a
pasted log. Deterministic: a session is a function of (half, shape, language, seed).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HALVES = ("dev", "heldout", "fresh")
JUDGED = ("heldout", "fresh")  # never tuned on: the targets are checked on these
LANGUAGES = ("en", "zh", "ja")
SHAPES = ("aider", "codex", "claude_code", "opencode", "chat")
PER, STRIDE = 7, 5  # statements per session, and how far the next session's start moves
KINDS = (
    "rule",
    "prohibition",
    "constraint",
    "decision",
    "preference",
    "goal",
    "correction",
    "fact",
)


@dataclass(frozen=True)
class Item:
    """One stated item: `text` must reach the model word for word."""

    id: str
    kind: str
    text: str


@dataclass(frozen=True)
class Content:
    """A file, tool output or pasted log, exactly as the client puts it on the wire."""

    name: str
    text: str
    start: int = 0  # where the content itself starts (after an agent's framing header)

    def probe(self) -> str:
        """The part that shows this content kept: its first two non-empty lines, at most 160
        characters (a short file of long lines keeps a part without keeping 160 characters)."""
        lines = [line for line in self.text[self.start :].split("\n") if line.strip()][:2]
        return "\n".join(lines)[:160] if len(lines) < 2 else _joined(self.text, self.start, lines)


def _joined(text: str, start: int, lines: list[str]) -> str:
    """The two lines as the text has them (blank lines between them included), cut at 160."""
    first = text.index(lines[0], start)
    second = text.index(lines[1], first + len(lines[0]))
    return text[first : second + len(lines[1])][:160]


@dataclass(frozen=True)
class Say:
    """The user types `text` (which may hold stated items)."""

    text: str


@dataclass(frozen=True)
class Paste:
    """The user pastes `content` (a log, a command's output) between two lines of prose."""

    intro: str
    content: Content
    after: str = ""


@dataclass(frozen=True)
class Call:
    """One tool call: a `kind` (read, shell, grep) on `target`, and what it printed."""

    call_id: str
    kind: str
    target: str
    output: Content


@dataclass(frozen=True)
class Step:
    """The assistant's tool calls (with a short thought) and their results."""

    thought: str
    calls: tuple[Call, ...]


@dataclass(frozen=True)
class Reply:
    text: str


Event = Say | Paste | Step | Reply


@dataclass(frozen=True)
class Session:
    id: str
    half: str
    shape: str
    language: str
    events: tuple[Event, ...]
    items: tuple[Item, ...]
    depends_on: tuple[Item | Content, ...]
    files: tuple[Content, ...] = ()  # files the client added to the chat (Aider)
    head: Mapping[str, Any] = field(default_factory=dict)  # what the shape renders around events

    @property
    def api(self) -> str:
        from . import shapes

        return shapes.API[self.shape]

    def requests(self) -> Iterator[dict[str, Any]]:
        """Every request body the client sends, in order (each a new dict)."""
        from . import shapes

        return shapes.render(self)


@cache
def load(half: str) -> Mapping[str, Any]:
    if half not in HALVES:
        raise ValueError(f"no half {half!r}; halves: {HALVES}")
    data: Mapping[str, Any] = json.loads((HERE / f"{half}.json").read_text())
    return data


def statement_items(half: str, language: str) -> list[tuple[Mapping[str, Any], tuple[Item, ...]]]:
    """Each statement of the half and language with its items (ids are stable)."""
    out = []
    for n, statement in enumerate(load(half)["languages"][language]["statements"]):
        items = tuple(
            Item(f"{half}-{language}-{n:02d}{'abc'[k]}", kind, text)
            for k, (kind, text) in enumerate(statement["items"])
        )
        out.append((statement, items))
    return out


def all_items(half: str) -> list[Item]:
    return [i for lang in LANGUAGES for _, items in statement_items(half, lang) for i in items]


def sessions(
    half: str, seeds: int = 2, shapes: Sequence[str] = SHAPES, languages: Sequence[str] = LANGUAGES
) -> list[Session]:
    """The half's sessions for every shape and language, `seeds` each. A session is the same
    whatever else is asked for; with two seeds or more, every statement of a language's pool
    is used by at least one session (each takes `PER` statements, `STRIDE` further on)."""
    from .plan import build

    out = []
    for language in languages:
        pool = statement_items(half, language)
        order = list(range(len(pool)))
        random.Random(f"{half}-{language}").shuffle(order)
        for seed in range(seeds):
            for shape in shapes:
                n = seed * len(SHAPES) + SHAPES.index(shape)
                picked = {order[(n * STRIDE + k) % len(order)] for k in range(PER)}
                out.append(build(half, shape, language, seed, [pool[i] for i in sorted(picked)]))
    return out
