"""Recovery when nothing else fits (design D5.10).

Three modes, chosen per policy by `recovery_mode`:
- `truncate` (default: the client gets an answer): cut the middle out of the largest contents,
  with a marker saying how much was cut, until the request fits. System/developer prompts are
  never cut (design D1.1); if they alone do not fit, nothing can, and the result says so.
- `fresh_start`: a short handover summary of the conversation plus the latest user message. Needs
  a summary; while it is missing the request is pending, and if the summariser failed, truncate.
- `error`: change nothing and explain what did not fit; the gateway answers 400
  `context_length_exceeded` and sends nothing upstream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .budget import Budget
from .content import with_text
from .conversation import PROTECTED_ROLES, Conversation, Message, content_text
from .step import Env, StepResult
from .summaries import SummaryRequest, prepare_for_summary

HANDOVER_INSTRUCTIONS = (
    "The conversation below no longer fits the model's context window. Write a short handover "
    "note so that the work can continue from the next user message alone: the task, decisions "
    "made, facts and file names that matter, and what was in progress. No greetings or filler."
)
HANDOVER_TOKENS = 500
TRUNCATION_MARKER = "\n[... {n} characters cut by compactgate to fit the context window ...]\n"

RecoveryMode = Literal["truncate", "fresh_start", "error"]


@dataclass(frozen=True, slots=True)
class RecoveryOutcome:
    """What a recovery did: `result` is None when nothing was changed (mode `error`)."""

    mode: str
    result: StepResult | None
    error: str | None = None


def recover(
    conversation: Conversation, budget: Budget, env: Env, mode: RecoveryMode
) -> RecoveryOutcome:
    if mode == "error":
        return RecoveryOutcome("error", None, error=describe_overflow(conversation, budget))
    if mode == "fresh_start":
        outcome = fresh_start(conversation, budget, env)
        if outcome is not None:
            return RecoveryOutcome("fresh_start", outcome)
    result = truncate(conversation, budget, env)
    if result.conversation.tokens > budget.limit:
        return RecoveryOutcome(
            "truncate", result, error=describe_overflow(result.conversation, budget)
        )
    return RecoveryOutcome("truncate", result)


def describe_overflow(conversation: Conversation, budget: Budget) -> str:
    """A message naming what does not fit, for the client's 400 body."""
    head = sum(m.tokens for m in conversation.messages if m.role in PROTECTED_ROLES)
    latest = conversation.latest_user_index()
    latest_tokens = conversation.messages[latest].tokens if latest is not None else 0
    return (
        f"The request needs {conversation.tokens} tokens for its messages after compaction, but "
        f"only {budget.limit} fit: context window {budget.context_window}, minus "
        f"{budget.reserved_output} reserved for the output, minus {budget.fixed_tokens} for tool "
        f"definitions and overhead. The system/developer prompts take {head} tokens and the "
        f"latest user message {latest_tokens}; these are never dropped."
    )


def fresh_start(conversation: Conversation, budget: Budget, env: Env) -> StepResult | None:
    """Head + handover summary + latest user message; None when the summariser failed."""
    head_end = conversation.head_end()
    latest = conversation.latest_user_index()
    history = tuple(
        m.data for i, m in enumerate(conversation.messages) if i >= head_end and i != latest
    )
    request = SummaryRequest(
        purpose="fresh_start",
        messages=prepare_for_summary(history),
        instructions=HANDOVER_INSTRUCTIONS,
        max_tokens=HANDOVER_TOKENS,
    )
    answer = env.summaries.get(request)
    if answer.status == "failed":
        return None
    keep = [m for i, m in enumerate(conversation.messages) if i < head_end or m.pin]
    added = 0
    if answer.status == "ready":
        data = {
            "role": "system",
            "content": f"[Handover summary of the earlier conversation: {answer.text}]",
        }
        keep.append(Message(data=data, tokens=env.count(data)))
        added = 1
    if latest is not None and not conversation.messages[latest].pin:
        keep.append(conversation.messages[latest])
    result = Conversation(tuple(keep))
    if result.tokens > budget.limit:
        result = truncate(result, budget, env).conversation
    pending = (request,) if answer.status == "missing" else ()
    return StepResult(
        result,
        removed=len(conversation) - (len(result) - added),
        added=added,
        pending=pending,
        summary_used=answer.status == "ready",
    )


def truncate(conversation: Conversation, budget: Budget, env: Env) -> StepResult:
    """Cut the middle of the largest non-system contents until the messages fit."""
    messages = list(conversation.messages)
    replaced: set[int] = set()
    for _ in range(len(messages) * 2 + 4):
        excess = sum(m.tokens for m in messages) - budget.limit
        if excess <= 0:
            break
        candidates = [
            i
            for i, m in enumerate(messages)
            if m.role not in PROTECTED_ROLES and len(content_text(m.data.get("content"))) > 200
        ]
        if not candidates:
            break
        index = max(candidates, key=lambda i: (messages[i].tokens, -i))
        message = messages[index]
        text = content_text(message.data.get("content"))
        # Characters per token of this message, so the cut lands near the excess in one go.
        ratio = max(1.0, len(text) / max(1, message.tokens))
        cut = min(len(text) - 200, int((excess + 32) * ratio * 1.1))
        if cut <= 0:
            break
        data = with_text(message.data, _cut_middle(text, cut))
        messages[index] = message.with_data(data, env.count(data))
        replaced.add(index)
    return StepResult(Conversation(tuple(messages)), replaced=len(replaced))


def _cut_middle(text: str, cut: int) -> str:
    keep = len(text) - cut
    head = keep // 2
    tail = keep - head
    return text[:head] + TRUNCATION_MARKER.format(n=cut) + text[len(text) - tail :]
