"""Where a summary goes (design D5.11): its own system message, user messages, or the system prompt.

- `system`: a system message `[Earlier conversation summary: ...]` where the summarised
  range was. Clear to the model, but some strict chat templates (several open-weight models
  served by vLLM or llama.cpp) reject a system message after the first position.
- `user`: the `<retain>` part as a user message, then the summary as a user message, where
  the range was. Accepted everywhere; the model reads it as something the user said.
- `system_append`: appended to the first system/developer prompt (a new system message
  is put first when there is none). The safest for strict templates; the original prompt stays a
  prefix of the new one, which is what the invariant checker allows (design D1.1).

Inserted messages carry `kind="summary:<step>"` so that a step recognises its own summary on the
chain's next pass and leaves it alone. Trimming steps that run after a summarising step (`fifo`)
keep them like the head and drop the oldest Turns after them instead (`summary_indices`): the
summary stands for everything before it, so dropping it first would lose the most per token. They
are not pinned, though: a created message (origin -1) is not protected, so when even the summary
does not fit, `emergency` (and recovery) can still drop it, and the chain fits whenever the
client's irreducible part does.
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Literal

from .content import append_text
from .conversation import PROTECTED_ROLES, Conversation, Message, inserted
from .step import Env

Placement = Literal["system", "user", "system_append"]

SUMMARY_TEMPLATE = "[Earlier conversation summary: {summary}]"
RETAIN_TEMPLATE = "[Retained from the earlier conversation: {retain}]"


def summary_kind(step_type: str) -> str:
    return f"summary:{step_type}"


_KIND = operator.attrgetter("kind")


def has_summary(conversation: Conversation, step_type: str) -> bool:
    """Whether `step_type` already placed a summary in this conversation (an earlier pass)."""
    kind = summary_kind(step_type)
    return kind in map(_KIND, conversation.messages)


def summary_indices(conversation: Conversation) -> frozenset[int]:
    """Messages a summarising step inserted (any step's); empty when there are none."""
    return frozenset(
        [
            i
            for i, m in enumerate(conversation.messages)
            if m.origin < 0 and m.kind is not None and m.kind.startswith("summary:")
        ]
    )


def render(template: str, text: str) -> str:
    return template.replace("{summary}", text.strip())


def place_summary(
    conversation: Conversation,
    at: int,
    summary: str,
    retain: str,
    placement: Placement,
    template: str,
    step_type: str,
    env: Env,
) -> tuple[Conversation, int, int]:
    """Put the summary (and the retained part, if any) in; returns (result, added, replaced)."""
    kind = summary_kind(step_type)
    texts = []
    if retain.strip():
        texts.append(RETAIN_TEMPLATE.replace("{retain}", retain.strip()))
    texts.append(render(template, summary))
    if placement == "system_append":
        messages = list(conversation.messages)
        first = next((i for i, m in enumerate(messages) if m.role in PROTECTED_ROLES), None)
        if first is None:
            data = {"role": "system", "content": "\n\n".join(texts)}
            return inserted(conversation, 0, [Message(data, env.count(data), kind=kind)]), 1, 0
        old = messages[first]
        data = append_text(old.data, "\n\n" + "\n\n".join(texts))
        messages[first] = replace(old, data=data, tokens=env.count(data), kind=kind, uid=None)
        return Conversation(tuple(messages)), 0, 1
    role = "system" if placement == "system" else "user"
    new = []
    for text in texts:
        data = {"role": role, "content": text}
        new.append(Message(data=data, tokens=env.count(data), kind=kind))
    return inserted(conversation, at, new), len(new), 0
