"""Dropping whole Turns by relevance, leaving one placeholder per run.

Shared by `prioritize_recent` and `discard_low_rel`. The last `recent_bias` share of the Turns
(at least one: the current Turn) is always kept; Turns holding a P1 message (`priority == 1`)
have their score multiplied by `priority_boost`. Candidates are dropped lowest score first (the
older first on ties), by default only until the request is back under the policy's target.

A run of consecutive dropped Turns leaves ONE placeholder message,
`[Omitted N low-relevance earlier turns]`. Its role is `system` by default: it is the gateway
speaking, not the user or the model, it does not start a new Turn (so it never becomes "the
latest user message" and never shifts Turn counts), and later steps treat it as protected. Some
strict chat templates reject a system message after the first position: `placeholder_role:
user` is the alternative (OpenAI and most servers accept two user messages in a row).

Never drops: Turns where the user stated something salient (`keep_salience`, see
`policies/salience.py`: a rule, a constraint, a fact; relevance to the current task cannot tell
it will matter later), the head, the recent Turns, pinned and system/developer messages (with
their tool groups), the latest user message. Tool groups always stay whole (whole Turns are
dropped).

Cache stability, the trade-off: relevance is computed against the latest user message, which
changes on every request, so the set of dropped Turns (and the prefix sent upstream) can change
on every request too, and the provider's prompt cache misses from the first change on. These
steps belong late in a chain, for when nothing cheaper (masking, chunking, a stable cut) fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from .budget import Budget
from .conversation import Conversation, Message, Turn, drop
from .relevance import Scorer, turn_scores
from .rollup import anchored
from .salience import salience
from .step import Env, StepConfig, StepResult

PLACEHOLDER = "[Omitted {n} low-relevance earlier {turns}]"


class PruningConfig(StepConfig):
    """Keys both relevance steps share."""

    recent_bias: float = Field(0.2, ge=0, le=1, description="Share of last Turns always kept")
    priority_boost: float = Field(1.5, ge=1, description="Score multiplier for Turns with P1")
    scorer: Scorer = "bm25"
    stop_at_target: bool = Field(True, description="Stop dropping once under the policy's target")
    placeholder_role: Literal["system", "user"] = "system"
    keep_salience: float = Field(
        0.6, ge=0, le=1.01, description="Turns where the user said something this salient stay"
    )


def placeholder_kind(step_type: str) -> str:
    return f"placeholder:{step_type}"


def scored_candidates(
    conversation: Conversation, config: PruningConfig, env: Env
) -> tuple[tuple[Turn, ...], list[tuple[float, int]], str] | None:
    """(Turns, [(boosted score, turn index)] of the droppable ones lowest first, scorer used)."""
    turns = conversation.turns()
    recent = max(1, math.ceil(len(turns) * config.recent_bias))
    if len(turns) <= recent:
        return None
    scores, used = turn_scores(conversation, turns, config.scorer, env, recent)
    ranked = []
    for index, turn in enumerate(turns[: len(turns) - recent]):
        if _holds_salient(conversation, turn, config.keep_salience, env):
            continue
        score = scores[index]
        if any(m.priority == 1 for m in conversation.messages[turn.start : turn.end]):
            score *= config.priority_boost
        ranked.append((round(score, 6), index))
    ranked.sort()
    return turns, ranked, used


def _holds_salient(conversation: Conversation, turn: Turn, threshold: float, env: Env) -> bool:
    """Whether the user said something in `turn` that must not be dropped for being off-topic."""
    for message in conversation.messages[turn.start : turn.end]:
        if message.role == "user" and _salience(message.text, env) >= threshold:
            return True
    return False


def _salience(text: str, env: Env) -> float:
    return env.memo.get(("salience", text), lambda: salience(text), len(text))


def prune(
    conversation: Conversation,
    budget: Budget,
    env: Env,
    config: PruningConfig,
    step_type: str,
    turns: Sequence[Turn],
    order: Sequence[int],
) -> StepResult:
    """Drop the Turns in `order` (stopping at the target if configured), with placeholders."""
    fixed = anchored(conversation)
    latest = conversation.latest_user_index()
    tokens = conversation.tokens
    chosen: list[int] = []
    for index in order:
        if config.stop_at_target and tokens <= budget.target:
            break
        turn = turns[index]
        tokens -= sum(
            conversation.messages[i].tokens
            for i in range(turn.start, turn.end)
            if i not in fixed and i != latest
        )
        chosen.append(index)
    if not chosen:
        return StepResult.unchanged(conversation, reason="nothing to drop")
    indices = [i for index in chosen for i in range(turns[index].start, turns[index].end)]
    result, removed = drop(conversation, indices)
    if not removed:
        return StepResult.unchanged(conversation, reason="only protected messages")
    kept = {id(m) for m in result.messages}
    runs = _runs(sorted(chosen))
    starts = {turns[first].start: last - first + 1 for first, last in runs}
    messages: list[Message] = []
    for i, message in enumerate(conversation.messages):
        if i in starts:
            n = starts[i]
            data = {
                "role": config.placeholder_role,
                "content": PLACEHOLDER.format(n=n, turns="turn" if n == 1 else "turns"),
            }
            messages.append(
                Message(data=data, tokens=env.count(data), kind=placeholder_kind(step_type))
            )
        if id(message) in kept:
            messages.append(message)
    return StepResult(
        Conversation(tuple(messages)),
        removed=removed,
        added=len(runs),
        detail={"turns_dropped": len(chosen)},
    )


class PruningStep:
    """Base of the relevance steps: they differ only in which of the scored Turns they drop."""

    type: ClassVar[str]

    def __init__(self, config: PruningConfig) -> None:
        self.config = config

    def order(self, turns: Sequence[Turn], ranked: Sequence[tuple[float, int]]) -> list[int]:
        """The Turns to drop, in the order they go; `ranked` is (score, index), lowest first."""
        raise NotImplementedError

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        if already_pruned(conversation, self.type):
            return StepResult.unchanged(conversation, reason="already applied")
        scored = scored_candidates(conversation, self.config, env)
        if scored is None:
            return StepResult.unchanged(conversation, reason="only recent turns")
        turns, ranked, scorer = scored
        order = self.order(turns, ranked)
        result = prune(conversation, budget, env, self.config, self.type, turns, order)
        return StepResult(
            result.conversation,
            removed=result.removed,
            added=result.added,
            detail={**result.detail, "scorer": scorer},
        )


def already_pruned(conversation: Conversation, step_type: str) -> bool:
    kind = placeholder_kind(step_type)
    return any(m.kind == kind for m in conversation.messages)


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return runs
