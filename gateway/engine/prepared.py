"""What the engine decided for one request (`Prepared`): the bytes to forward and the figures
reported about them, and how those figures become exact for a request forwarded on its upper
bound (`when_settled`).

A `Prepared` is a value: made once by `render.py`, never changed; a late count's exact figures
give a new one (`settled`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from policies import Budget, ChainResult, Conversation, StepReport, StoredOutput

from ..counting.tokenizers import CharsTokenizer
from ..counting.tokens import PRIMING_TOKENS
from ..routing import Route


@dataclass(frozen=True, slots=True)
class ExactCount:
    """The exact figures of a request forwarded on its upper bound, counted afterwards."""

    tokens: int  # the whole prompt
    system: int
    tools: int
    budget: Budget | None


@dataclass(frozen=True, slots=True)
class Prepared:
    """What the gateway decided for one request."""

    route: Route
    body: bytes  # what to forward
    tokens_before: int
    tokens_after: int
    budget: Budget | None
    chain: ChainResult | None
    counts_by_role: Mapping[str, int]
    tokens_by_region: Mapping[str, int]
    messages: list[Any]  # the messages forwarded
    observe: bool = False  # shadow mode: `body` is the original; the chain is what would be done
    api: str = "chat"  # the wire API of the request
    correction: float | None = None  # the calibration multiplier the counts were made with
    injected_usage: bool = False  # we asked for stream usage the client did not ask for
    priority_preserved: float = 1.0  # share of pinned / priority-1 messages kept (event reward)
    expandable: bool = False  # masked tool outputs: the expansion tools were added
    # The client's messages as the chain saw them (with counts and uids); None when no chain ran.
    conversation: Conversation | None = None
    # The uid of each client message (equal uids: equal messages, `prefix`): which conversation
    # it is and whether it only appended to the last request (cost accounting's cache model).
    uids: tuple[int | None, ...] = ()
    # Forwarded on its upper bound: the token figures are that bound (UTF-8 bytes of the texts
    # plus the framing), not counts; `late` makes the exact ones off the request path.
    bounded: bool = False
    late: asyncio.Future[ExactCount] | None = None

    def settled(self) -> Prepared:
        """This request with its exact figures when they are known (else as it is)."""
        late = self.late
        if late is None or not late.done() or late.cancelled() or late.exception() is not None:
            return self
        exact = late.result()
        history = exact.tokens - exact.tools - PRIMING_TOKENS - exact.system
        return replace(
            self,
            tokens_before=exact.tokens,
            tokens_after=exact.tokens,
            budget=exact.budget,
            tokens_by_region={"system": exact.system, "tools": exact.tools, "history": history},
            bounded=False,
            late=None,
        )

    @property
    def stored(self) -> tuple[StoredOutput, ...]:
        """Full texts of the tool outputs masked in what is forwarded."""
        return self.chain.stored if self.chain is not None and not self.observe else ()

    warnings: tuple[str, ...] = field(default=())

    @property
    def sent_tokens(self) -> int:
        """Our estimate of the prompt actually forwarded (the original in shadow mode)."""
        return self.tokens_before if self.observe else self.tokens_after

    @property
    def steps(self) -> tuple[StepReport, ...]:
        return self.chain.steps if self.chain is not None else ()

    @property
    def changed_steps(self) -> list[str]:
        return self.chain.changed_steps() if self.chain is not None else []


def when_settled(prepared: Prepared | None, then: Callable[[Prepared | None], None]) -> None:
    """`then(prepared)` with exact figures: at once when they are known, else when the count
    made off the request path ends (with the bound, still `bounded`, if it was abandoned)."""
    late = prepared.late if prepared is not None else None
    if late is None or late.done() or prepared is None:
        then(prepared.settled() if prepared is not None else None)
        return
    late.add_done_callback(lambda _: then(prepared.settled()))


def correction_of(route: Route) -> float | None:
    """The calibration multiplier of the route's heuristic tokenizer, None for exact ones."""
    tokenizer = route.counter.tokenizer
    return tokenizer.correction if isinstance(tokenizer, CharsTokenizer) else None
