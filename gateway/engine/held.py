"""Between compaction events, a conversation's forwarded requests only grow by appending.

A client resends its whole history every turn. After a compaction event the gateway forwards a
compacted history; on the next turn the client sends that same history plus a few new messages.
Running the chain again would compact again (another masked output, another dropped Turn), so
the forwarded prefix would change on every turn and the provider's prompt cache would never hit.
Instead the event's result is held per conversation: while the client only appended and the held
result plus what it appended stays at or under the budget's hold (`hold_ratio`, past the
trigger: appending costs the new messages at the provider, an event the whole prompt), that is
what is forwarded, byte for byte the previous forwarded request with the new messages after it.
The next event comes when it passes the hold (the chain then runs on the whole conversation again
and ends at the target).

Holding is a per-process memo, like the prefix counts it builds on: the uids `PrefixCounts`
gives messages say, by equality, that the client's messages up to the held point are unchanged.
A replica that has not seen a conversation runs the chain (still deterministic, and its own
stable cuts), so holding only ever saves compaction work and cache misses, never changes what
is valid to send. Bounded by the number of conversations held.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from policies import Budget, ChainResult, Conversation

MAX_HELD = 512


@dataclass(frozen=True, slots=True)
class _Held:
    source: tuple[int | None, ...]  # uids of the client messages the event compacted
    budget: Budget
    chain: ChainResult  # what the event forwarded


class HeldResults:
    """The latest compaction event's result of each conversation (tenant, route, first message)."""

    def __init__(self, max_conversations: int = MAX_HELD) -> None:
        self._held: OrderedDict[tuple[str, int], _Held] = OrderedDict()
        self._max = max_conversations
        self.extended = 0  # requests answered from a held result

    def extend(self, scope: str, conversation: Conversation, budget: Budget) -> ChainResult | None:
        """The held result with the messages appended since, if the client only appended, the
        budget is the same and it stays at or under the hold; else None (an event is due)."""
        key = _key(scope, conversation)
        if key is None:
            return None
        held = self._held.get(key)
        if held is None or held.budget != budget:
            return None
        count = len(held.source)
        messages = conversation.messages
        if len(messages) < count or any(
            messages[i].uid != uid for i, uid in enumerate(held.source)
        ):
            return None
        appended = messages[count:]
        tokens = held.chain.conversation.tokens + sum(m.tokens for m in appended)
        if tokens > budget.hold:
            return None
        self._held.move_to_end(key)
        self.extended += 1
        return replace(
            held.chain,
            conversation=Conversation(held.chain.conversation.messages + appended),
            tokens_before=conversation.tokens,
            tokens_after=tokens,
            triggered=False,
            pending=(),
        )

    def remember(
        self, scope: str, conversation: Conversation, budget: Budget, chain: ChainResult
    ) -> None:
        """Hold an event's result (one whose compaction the request can be sent with)."""
        key = _key(scope, conversation)
        if key is None or any(m.uid is None for m in conversation.messages):
            return
        self._held[key] = _Held(tuple(m.uid for m in conversation.messages), budget, chain)
        self._held.move_to_end(key)
        while len(self._held) > self._max:
            self._held.popitem(last=False)

    def holds(self, scope: str, conversation: Conversation, count: int, budget: Budget) -> bool:
        """Whether the result held for `conversation` is of its first `count` messages with
        this budget (another replica's record of the same event needs no second run)."""
        key = _key(scope, conversation)
        held = self._held.get(key) if key is not None else None
        return held is not None and len(held.source) == count and held.budget == budget

    def forget(self, scope: str, conversation: Conversation) -> None:
        key = _key(scope, conversation)
        if key is not None:
            self._held.pop(key, None)


def _key(scope: str, conversation: Conversation) -> tuple[str, int] | None:
    if not conversation.messages or conversation.messages[0].uid is None:
        return None
    return (scope, conversation.messages[0].uid)
