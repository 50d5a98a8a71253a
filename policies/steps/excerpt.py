"""`excerpt` (design D5.13): no whole-message cliff.

A large user or tool message that must shrink keeps its head (and, unless it is code, its
tail) and puts the rest behind a ref (`policies.excerpts`): the hidden lines are returned as
stored outputs, which the gateway keeps and reads back for the model through the same
expansion tool as masked tool outputs (design D13.4). A message with fenced blocks (Aider's
files, a pasted log) is cut block by block, so every file keeps a part and the prose around
the blocks stays whole.

Where and how much: the oldest large messages first, by a stable partial cut (the rule of
`budget.stable_cut`, with a message allowed to give up only part of itself). The history is
scanned as it grew; wherever the running total passes the trigger, the oldest large messages
before the tool group being scanned give up tokens, each down to its floor, until the total is
back at the target: the last one touched gives up exactly what is needed, so the request lands
at the target, not far below it. The cut is a function of the conversation's prefix: appending
messages never changes an earlier excerpt, so between compaction events an excerpted message
renders the same bytes (design D3.1).

Never touched: system and developer prompts, pinned messages, the latest user message (D1.3),
messages under `min_tokens`, the gateway's own expansion results, tool outputs that
`tool_output_cache` already cut or masked, and excerpts (never excerpted twice). A content array
has its largest text part excerpted; its other parts stay as they are.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field

from ..budget import Budget
from ..content import with_text
from ..conversation import Conversation, Message
from ..excerpts import NOTE_SAMPLE, Block, Excerpt, blocks, excerpt, is_excerpt
from ..step import Env, StepConfig, StepResult, StoredOutput
from .tool_output_cache import (
    EXPANSION_ID_PREFIX,
    EXPANSION_TOOLS,
    expansion_call_ids,
    find_note,
    group_start,
    is_placeholder,
)

MIN_SAVING = 32  # a message that would give up fewer tokens than this is left whole


class ExcerptConfig(StepConfig):
    TYPE: ClassVar[str] = "excerpt"
    type: Literal["excerpt"] = "excerpt"
    roles: tuple[str, ...] = Field(("user", "tool"), min_length=1, description="Whose messages")
    min_tokens: int = Field(800, ge=64, description="Smaller messages are never excerpted")
    floor_tokens: int = Field(
        160, ge=16, description="What each block of an excerpt keeps at least (its head)"
    )
    aim: float = Field(
        0.75,
        gt=0,
        le=1,
        description="At an event, cut to this share of the target: room to grow until the next",
    )


class Excerpts:
    type: ClassVar[str] = "excerpt"

    def __init__(self, config: ExcerptConfig) -> None:
        self.config = config

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        messages = conversation.messages
        roles = conversation.roles()
        protected = conversation.protected()
        expansion = expansion_call_ids(messages)
        allowed, least = self.config.roles, self.config.min_tokens
        candidates = [
            i
            for i, m in enumerate(messages)
            if roles[i] in allowed
            and not protected[i]
            and m.tokens >= least
            and _excerptable(m, expansion)
        ]
        if not candidates:
            return StepResult.unchanged(conversation, reason="no large messages")
        removal = self._plan(messages, roles, candidates, budget, env)
        new = list(messages)
        stored: list[StoredOutput] = []
        for i, tokens in removal.items():
            if tokens < MIN_SAVING:
                continue
            cut = self._excerpt(messages[i], tokens, env)
            if cut is None:
                continue
            data, outputs = cut
            new[i] = messages[i].with_data(data, env.count(data))
            stored.extend(outputs)
        if not stored:
            return StepResult.unchanged(conversation, reason="nothing to cut")
        replaced = sum(1 for a, b in zip(messages, new, strict=True) if a is not b)
        return StepResult(
            conversation.with_contents(new),
            replaced=replaced,
            stored=tuple(stored),
            detail={"excerpted": replaced, "blocks_cut": len(stored)},
        )

    def _plan(
        self,
        messages: Sequence[Message],
        roles: Sequence[str],
        candidates: Sequence[int],
        budget: Budget,
        env: Env,
    ) -> dict[int, int]:
        """Tokens each candidate gives up: the stable partial cut (see the module's rule)."""
        excess: dict[int, int] = {}

        def room(i: int) -> int:
            if i not in excess:
                count = len(_blocks(messages[i].text, env))
                floor = (self.config.floor_tokens + env.text_tokens(NOTE_SAMPLE)) * count
                excess[i] = max(0, messages[i].tokens - floor)
            return excess[i]

        removed: dict[int, int] = defaultdict(int)
        at = 0
        running = 0
        # In an event's second pass (design D3.2) the budget is a band lower: its trigger is the
        # event's target, and `aim` of that is what the first pass aims at too.
        goal = budget.trigger if budget.event_pass else budget.target
        trigger, target = budget.trigger, int(goal * self.config.aim)
        for j, message in enumerate(messages):
            running += message.tokens
            if running <= trigger or at == len(candidates):
                continue
            bound = group_start(messages, roles, j)
            while at < len(candidates) and candidates[at] < bound and running > target:
                i = candidates[at]
                take = min(room(i) - removed[i], running - target)
                removed[i] += take
                running -= take
                if removed[i] >= room(i):
                    at += 1
        return {i: t for i, t in removed.items() if t > 0}

    def _excerpt(
        self, message: Message, tokens: int, env: Env
    ) -> tuple[dict[str, Any], tuple[StoredOutput, ...]] | None:
        """The message giving up about `tokens`: its largest text part excerpted."""
        content = message.data.get("content")
        if isinstance(content, list):
            texts = [
                (k, p["text"])
                for k, p in enumerate(content)
                if isinstance(p, Mapping)
                and p.get("type") == "text"
                and isinstance(p.get("text"), str)
            ]
            if not texts:
                return None
            position, text = max(texts, key=lambda kt: len(kt[1]))
        else:
            position, text = -1, message.text
        keep = max(0, env.text_tokens(text) - tokens)
        found = self._cut(text, keep, env)
        if found is None:
            return None
        if position < 0:
            return with_text(message.data, found.text), found.stored
        assert isinstance(content, list)
        parts = list(content)
        parts[position] = {**parts[position], "text": found.text}
        return {**message.data, "content": parts}, found.stored

    def _cut(self, text: str, keep: int, env: Env) -> Excerpt | None:
        key = ("excerpt", env.scope, self.config.floor_tokens, keep, text)
        found = env.memo.peek(key)
        if found is None:
            try:
                found = excerpt(text, keep, env.text_tokens, env.ref_for, self.config.floor_tokens)
            except LookupError:  # no ref function: nothing can be stored, nothing is cut
                found = None
            env.memo.put(key, found or False, len(text))
        return found or None  # type: ignore[return-value]


def _blocks(text: str, env: Env) -> list[Block]:
    return env.memo.get(("excerpt-blocks", text), lambda: blocks(text), len(text))


def _excerptable(message: Message, expansion: set[str]) -> bool:
    """Not the gateway's own output, not a view or placeholder, not an excerpt already."""
    if message.role == "tool":
        call_id = str(message.data.get("tool_call_id", ""))
        if call_id.startswith(EXPANSION_ID_PREFIX) or call_id in expansion:
            return False
        if message.data.get("name") in EXPANSION_TOOLS:
            return False
    text = message.text
    return not (find_note(text) is not None or is_placeholder(text) or is_excerpt(text))
