"""Counting a request (design D12): exactly, or first by a proven upper bound, with the exact
count made off the request path ("late").

What a conversation repeats is never counted again: its messages' counts come from the prefix
memo (`counting.prefix`), so a request counts only what it added. When the route's tokenizer has
a proven upper bound (`MessageCounter.bound`) and the messages not counted yet are large, the
request is measured by that bound first. A bound under the trigger proves the exact count is
under it too, so the request may be forwarded at once, `bounded`, and counted exactly in the
background thread (`late`), for the next turn and for everything that reports tokens
(`prepared.when_settled`). Only a bound that reaches the trigger makes the request wait for its
exact count; even then, only until what is counted makes the bound fit (`Counting.until`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from policies import Budget

from ..counting.prefix import SYSTEM_ROLES, Counted, MemoReport, PrefixCounts
from ..counting.runner import Counting
from ..counting.tokenizers import UpstreamTokenizer
from ..counting.tokens import PRIMING_TOKENS, MessageCounter
from ..routing import Route
from ..wire import WireRequest
from .prepared import ExactCount

# Messages not counted yet smaller than this (by their bound, ~bytes) are counted at once: it
# costs well under a millisecond, less than handing the count to a thread.
LATE_MIN_BYTES = 16 * 1024

# Counts texts with a route's upstream tokenizer: (route, wire, texts, client headers) -> counts.
RemoteCounter = Callable[
    [Route, Any, Sequence[str], Sequence[tuple[bytes, bytes]] | None],
    Awaitable[list[int] | None],
]
# The messages' budget of a request against a window, its tool definitions counted as given.
BudgetOf = Callable[[WireRequest, Route, int, int | None], Budget | None]
# Whether messages of this many tokens plainly fit the budget (`decide.Decision.plainly_fits`).
Fits = Callable[[int, Budget | None, Route], bool]


@dataclass(frozen=True, slots=True)
class Bounded:
    """A request measured by its upper bound, which fits: forwarded now, counted later."""

    counts: list[int]  # exact for the leading messages the memo knew, bounds for the rest
    tools: int  # the tool definitions' bound
    budget: Budget | None
    late: asyncio.Task[ExactCount]  # the exact figures, made in the background


class Measure:
    """A process's counting of requests (module docstring)."""

    def __init__(
        self,
        counting: Counting,
        budget_of: BudgetOf,
        fits: Fits,
        count_remote: RemoteCounter | None = None,
        report: MemoReport | None = None,
    ) -> None:
        self.counting = counting
        self._budget_of = budget_of
        self._fits = fits
        self._count_remote = count_remote  # the upstream's own counts (`tokenizer: upstream`)
        self._prefix = PrefixCounts(report=report)
        self._settling: dict[str, asyncio.Task[ExactCount]] = {}  # latest late count per scope

    def counts(self, request: WireRequest, route: Route, tenant: str) -> Counted:
        """Per-message counts and uids; the unchanged prefix of a conversation is not counted
        again.

        Event-loop only (the prefix memo is not thread-safe).
        """
        return self._prefix.measure(
            f"{tenant}|{route.name}",
            route.counter.tokenizer.name,
            request.messages,
            route.counter.message,
            len(request.body),
        )

    def known(self, request: WireRequest, route: Route, tenant: str) -> Counted:
        """The counts the memo holds for the conversation's unchanged leading messages (the
        rest are counted by `exact` or bounded by `bound`)."""
        return self._prefix.known(
            f"{tenant}|{route.name}",
            route.counter.tokenizer.name,
            request.messages,
            len(request.body),
        )

    async def exact(
        self, request: WireRequest, route: Route, tenant: str, counted: Counted
    ) -> list[int]:
        """Every message's exact count: the memo's, then the rest counted now."""
        counts = counted.counts
        if len(counts) < len(request.messages):  # (`bound` may have counted them all)
            rest = request.messages[len(counts) :]
            counts.extend(await self.counting.exact(route.counter, tenant, rest))
        return counts

    def tools_tokens(
        self, request: WireRequest, route: Route, counter: MessageCounter | None = None
    ) -> int:
        """Tokens the request's tool definitions add to the prompt (by `counter`: the route's,
        or its upper bound)."""
        return request.wire.tools_tokens(request, counter or route.counter)

    async def bound(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        counted: Counted,
        window: int | None,
    ) -> Bounded | None:
        """The request measured by its upper bound, when that bound fits and the messages not
        counted yet are worth counting later; None: the caller counts them (all counted here
        already when only their exact counts fit, or the request does not fit at all).

        A bound over the trigger is first taken again without the JSON's syntax
        (`BoundCounter.narrow`), then narrowed by counting messages exactly (in the counting
        threads) until it fits; what is left is counted later.
        """
        bound = route.counter.bound
        assert bound is not None
        known = list(counted.counts)  # exact: the unchanged prefix of the conversation
        rest = request.messages[len(known) :]
        sizes = counted.rest_bounds(request.messages, bound.message)
        size = sum(sizes)
        if size < LATE_MIN_BYTES:
            return None
        tools = self.tools_tokens(request, route, bound)
        budget = self._budget_of(request, route, tools, window)
        base = sum(known)

        def fits(rest_bound: int) -> bool:
            return request.stateful or self._fits(base + rest_bound, budget, route)

        made: list[int | None] = [None] * len(rest)
        if not fits(size):
            # Before counting, the tighter bound: every byte it takes off is a byte less
            # to count, roughly (the lower of two upper bounds is one).
            sizes = [min(s, bound.narrow(m)) for s, m in zip(sizes, rest, strict=True)]
            if not fits(sum(sizes)):
                made = await self.counting.until(route.counter, tenant, rest, sizes, fits)
                exact = [c for c in made if c is not None]
                if len(exact) == len(made):
                    counted.counts.extend(exact)
                    return None
        counts = known + [s if c is None else c for c, s in zip(made, sizes, strict=True)]
        scope = f"{tenant}|{route.name}"
        after = self._settling.get(scope)
        late = self.counting.later(
            size, lambda: self._settle(request, route, tenant, known, sizes, window, after)
        )
        if late is None:
            return None
        self._settling[scope] = late
        late.add_done_callback(lambda done: self._settled(scope, done))
        return Bounded(counts, tools, budget, late)

    def _settled(self, scope: str, done: asyncio.Task[ExactCount]) -> None:
        if self._settling.get(scope) is done:
            del self._settling[scope]

    async def _settle(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        known: list[int],
        sizes: list[int],
        window: int | None,
        after: asyncio.Task[ExactCount] | None = None,
    ) -> ExactCount:
        """The exact figures of a request forwarded on its bound (`known`: the counts of its
        leading messages; `sizes`: the bounds of the rest), counted in the background thread.

        A conversation's late counts run one after the other (`after`: the one before), each
        taking what the memo has learnt from the ones before it: under load, requests that
        arrive while the first count is made would otherwise each look up and count the whole
        conversation again, ahead of that first count in the background thread's queue.
        """
        if after is not None and not after.done():
            await asyncio.wait([after])
        scope, tokenizer = f"{tenant}|{route.name}", route.counter.tokenizer.name
        learnt = self._prefix.peek(scope, tokenizer, request.messages)
        if len(learnt) > len(known):
            sizes = sizes[len(learnt) - len(known) :]
            known = learnt
        rest = request.messages[len(known) :]
        made = await self.counting.exact(route.counter, tenant, rest, sizes, background=True)
        tools = await self.counting.run(True, lambda: self.tools_tokens(request, route))
        exact = known + made
        self._prefix.fill(scope, tokenizer, request.messages, exact)
        system = sum(
            n for m, n in zip(request.messages, exact, strict=True) if m.get("role") in SYSTEM_ROLES
        )
        budget = self._budget_of(request, route, tools, window)
        return ExactCount(sum(exact) + tools + PRIMING_TOKENS, system, tools, budget)

    async def learn_remote(
        self,
        request: WireRequest,
        route: Route,
        headers: Sequence[tuple[bytes, bytes]] | None,
    ) -> None:
        """`tokenizer: upstream`: ask the upstream to count the texts it has not counted yet."""
        tokenizer = route.counter.tokenizer
        if not isinstance(tokenizer, UpstreamTokenizer) or self._count_remote is None:
            return
        counter = route.counter

        def count_all() -> None:
            for message in request.messages:
                counter.message(message)
            self.tools_tokens(request, route)

        missing = tokenizer.missing(counter.recorded(count_all))
        if missing:
            counts = await self._count_remote(route, request.wire, missing, headers)
            if counts is not None:
                tokenizer.learn(missing, counts)
