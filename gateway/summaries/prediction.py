"""What a precomputation predicts with: how a conversation grows, and what a chain summarised.

The rule this module keeps: **a prediction never guesses a message's content**. The conversation
is extended by an empty filler message of some size (more of this Turn, or a new Turn); a
summary request that covers a filler is dropped (`synthetic`), since the real messages are not
known yet.
"""

from __future__ import annotations

from policies import ChainResult, Conversation, Message
from policies.conversation import inserted
from policies.summaries import SummaryRequest
from policies.summarising import SummarisingStep

from ..routing import Route
from ..wire import WireRequest

GROWTH_REQUESTS = 3  # requests averaged when estimating how fast a conversation grows


def summarised(result: ChainResult, route: Route) -> list[tuple[str, int]]:
    """Messages each summarising step replaced: it changes only when a range moves."""
    summarising = summarising_steps(route)
    return [(r.type, r.messages_removed) for r in result.steps if r.type in summarising]


def summarised_tokens(result: ChainResult, route: Route) -> int:
    """Tokens after the chain's last summarising step: what its next range move depends on.

    Steps after it (`fifo`, `emergency`) may trim the request further, but a summarising step
    scans the whole conversation: its range moves as the conversation grows, wherever the later
    steps left the request (`summarize_old` moves with the Turn count, however far `fifo` cut).
    """
    summarising = summarising_steps(route)
    for report in reversed(result.steps):
        if report.type in summarising:
            return report.tokens_after
    return result.tokens_after


def summarising_steps(route: Route) -> set[str]:
    """The types of the route's summarising steps."""
    return {step.type for step in route.policy.steps if isinstance(step, SummarisingStep)}


def growth(conversation: Conversation, requests: int = GROWTH_REQUESTS) -> int:
    """Tokens a request adds, on average over the last few: each added an answer and what
    followed it (tool results, the next user message)."""
    roles = conversation.roles()
    answers, first = 0, len(roles)
    for at in range(len(roles) - 1, -1, -1):  # from the end: older history is not read
        if roles[at] == "assistant":
            answers, first = answers + 1, at
            if answers == requests:
                break
    if not answers:
        return conversation.tokens
    return sum(m.tokens for m in conversation.messages[first:]) // answers


_SAME_TURN = {"role": "assistant", "content": ""}  # what a prediction's filler message holds
_NEW_TURN = {"role": "user", "content": ""}


def synthetic(request: SummaryRequest) -> bool:
    """Whether a predicted summary request covers a filler (the messages are not known yet)."""
    return any(m is _SAME_TURN or m is _NEW_TURN for m in request.messages)


def extended(conversation: Conversation, filler: Message, tokens: int) -> Conversation:
    """`conversation` and a filler of `tokens` tokens. The tool groups (and, for a filler that
    is no user message, the roles and protected messages) the request's chain worked out are
    carried over: a prediction runs the chain several times on a conversation as long."""
    return inserted(conversation, len(conversation), [Message(data=filler.data, tokens=tokens)])


def fillers(request: WireRequest) -> tuple[Message | None, Message]:
    """What may come next: more of this Turn (an agent loop: the client sends tools), or a
    new Turn. A prediction that needs the model's coming answer is dropped later."""
    agent = bool(request.payload.get("tools") or request.payload.get("functions"))
    same = Message(data=_SAME_TURN, tokens=0) if agent else None
    return same, Message(data=_NEW_TURN, tokens=0)
