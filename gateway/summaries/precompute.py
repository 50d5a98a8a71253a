"""Summaries ahead of need: after a response, make the summary the next requests will ask for.

Rules this module keeps:

- **Only near the crossing**: after each response, `Precompute` checks whether the conversation
  has passed `precompute_ratio` of its budget; if so it predicts the summary the chain will ask
  for when the conversation crosses its trigger and computes it in the background, so the
  crossing request finds it ready. Precomputations are bounded (a semaphore and a bounded
  queue), never delay a response, and are cancelled at shutdown.
- **The same chain as a request**: a prediction runs the route's chain through a `ChainRunner`
  (the pipeline), on the conversation and budget a request would have, so what it computes is
  what the request will ask for.
- **Precomputation runs while the gateway waits**: its chain runs (a few ms of CPU on a long
  conversation) hold the GIL. Started the moment a response ends, they would overlap the
  client's next call, which an agent sends right after its tool returns. So a precomputation
  waits until the tenant's next request on that model has been prepared (it then runs while
  that request is at the upstream), or `precompute_defer_s`, whichever comes first. A summary
  takes seconds; starting it a tool call later costs nothing the lookahead does not cover.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from policies import Budget, ChainResult, Conversation, Message
from policies.summaries import SummaryRequest, SummarySource
from policies.summarising import SummarisingStep

from ..routing import Route
from ..wire import WireRequest
from .prediction import (
    extended,
    fillers,
    growth,
    summarised,
    summarised_tokens,
    synthetic,
)
from .service import RequestSummaries, SummaryService, average

log = logging.getLogger("compactgate.summaries")

MAX_ROUNDS = 16  # links of a rolling summary settled per precomputation
SEARCH_STEPS = 3  # bisection steps when predicting where the conversation crosses its trigger
PACE_GAP_S = 300.0  # a longer pause between responses is not the session's pace
MAX_PACES_KEPT = 10_000
MAX_LOOKAHEAD_FACTOR = 4.0


class ChainRunner(Protocol):
    """What a precomputation needs of the request path (the pipeline): a request's conversation
    and budget, and the route's chain run on them with a given summary source."""

    def conversation(self, request: WireRequest, route: Route) -> Conversation: ...

    def request_budget(
        self, request: WireRequest, route: Route, window: int | None
    ) -> Budget | None: ...

    def chain_for(
        self, route: Route, tenant: str, summaries: SummarySource
    ) -> Callable[[Conversation, Budget], ChainResult]: ...


class Sent(Protocol):
    """What the request path decided for the request a precomputation follows."""

    @property
    def route(self) -> Route: ...

    @property
    def budget(self) -> Budget | None: ...

    @property
    def chain(self) -> ChainResult | None: ...

    @property
    def conversation(self) -> Conversation | None: ...


@dataclass(frozen=True, slots=True)
class Job:
    request: WireRequest
    route: Route
    tenant: str
    headers: tuple[tuple[bytes, bytes], ...]
    window: int | None
    sent: ChainResult | None = None  # what the request path decided (saves running it again)
    lookahead: float = 2.0  # requests ahead of the crossing to start at
    # The request's conversation as the request path built it: counted already, and with the
    # uids that let the chain reuse its summary links instead of serialising them again.
    conversation: Conversation | None = None


class Precompute:
    """After a response, compute the summary the conversation will need at its trigger.

    Only past `precompute_ratio` of the budget, and only when the crossing is near: within
    `lookahead_requests` times what a request adds (averaged over the last few), or more
    requests when summaries take longer than that many requests at this tenant's pace. Predicting
    further ahead would compute a summary per request that the next one no longer wants. The
    prediction runs the real chain on the conversation extended by a synthetic message of `x`
    tokens, about the smallest `x` (bisection) for which the chain asks for a summary the store
    does not have: "what would be summarised if the next messages pushed it over now".
    The synthetic message continues the current Turn when the client sends tools (an agent loop,
    where the next request adds tool results), and, in a second prediction, starts a new Turn.
    A prediction whose range reaches the request's last message is dropped: the real range
    will also hold the model's answer to it, which is not known yet. When the next Turn needs
    nothing new and the summarising steps leave the request over the trigger, the Turn after it
    is tried (two empty Turns): a range that moves with the Turn count (`summarize_old`) extends
    the summary the next Turn uses, so it can only start once that one is made, and a short
    Turn would end before it is ready.

    "Past `precompute_ratio`" is judged on the tokens after the last summarising step, not on
    what was finally sent: a later trimming step (`fifo`) does not stop the range from moving.

    A scheduled precomputation first waits for the tenant's next request on the route to be
    prepared (`request_prepared`), at most `precompute_defer_s`: its chain runs then overlap
    that request's time at the upstream, not the moment the agent sends it.
    """

    def __init__(self, service: SummaryService, runner: ChainRunner) -> None:
        self.service = service
        self.runner = runner
        self.config = service.config
        self._slots = asyncio.Semaphore(self.config.background_concurrency)
        self._queued = 0
        self._seen: OrderedDict[tuple[str, str], tuple[float, float | None]] = OrderedDict()
        # Precomputations waiting for the next request of (tenant, route) to be prepared.
        self._deferred: dict[tuple[str, str], list[asyncio.Future[None]]] = {}

    def request_prepared(self, tenant: str, route: Route) -> None:
        """A request of `tenant` on `route` is prepared and about to go upstream: the
        precomputations waiting for it start now, while it waits for the answer."""
        if not self._deferred:  # the usual case: a dict lookup on every request is all it costs
            return
        for waiter in self._deferred.pop((tenant, route.name), ()):
            if not waiter.done():
                waiter.set_result(None)

    def after_response(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        headers: Sequence[tuple[bytes, bytes]],
        window: int | None,
        prepared: Sent | None = None,
    ) -> None:
        """Schedule a precomputation if it may be needed; returns at once."""
        if not self.config.precompute or self.service.closed or route.mode == "observe":
            return
        if window is None or not any(
            isinstance(step, SummarisingStep) for step in route.policy.steps
        ):
            return
        sent = prepared.chain if prepared is not None else None
        if prepared is not None and (
            sent is None or sent.pending or not self._past_point(prepared)
        ):
            return  # under the precompute point, or the request path is making what it needs
        if self._queued >= self.config.background_queue + self.config.background_concurrency:
            log.debug("precompute queue full; skipped")
            return
        self._queued += 1
        lookahead = self._lookahead(tenant, route)
        seen = prepared.conversation if prepared is not None else None
        job = Job(request, route, tenant, tuple(headers), window, sent, lookahead, seen)
        # Registered now, before this task awaits anything: the client's next request cannot
        # have been read yet, so its `request_prepared` is not missed.
        waiter = self._defer((tenant, route.name))
        self.service.spawn(self._run(job, waiter), name="precompute")

    def _defer(self, key: tuple[str, str]) -> asyncio.Future[None] | None:
        if self.config.precompute_defer_s <= 0:
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._deferred.setdefault(key, []).append(waiter)
        return waiter

    def _lookahead(self, tenant: str, route: Route) -> float:
        """`lookahead_requests`, or more when a summary takes longer than that many requests.

        The pace is this tenant's time between responses on this route (a running average);
        a summary started `n` requests ahead is ready in time if it takes under `n` of them.
        """
        now = time.monotonic()
        key = (tenant, route.name)
        last, interval = self._seen.pop(key, (None, None))
        if last is not None and now - last < PACE_GAP_S:
            interval = average(interval, now - last)
        self._seen[key] = (now, interval)
        if len(self._seen) > MAX_PACES_KEPT:
            self._seen.popitem(last=False)
        base = self.config.lookahead_requests
        took = self.service.summary_seconds
        if took is None or not interval:
            return base
        return min(base * MAX_LOOKAHEAD_FACTOR, max(base, took / interval + 1))

    def _past_point(self, prepared: Sent) -> bool:
        budget, chain = prepared.budget, prepared.chain
        if budget is None or chain is None:
            return False
        ratio = prepared.route.policy_config.precompute_ratio
        return summarised_tokens(chain, prepared.route) >= ratio * budget.limit

    async def _run(self, job: Job, waiter: asyncio.Future[None] | None = None) -> None:
        try:
            if waiter is not None:
                await self._next_request(waiter, (job.tenant, job.route.name))
            async with self._slots:
                await self.precompute(job)
        finally:
            self._queued -= 1

    async def _next_request(self, waiter: asyncio.Future[None], key: tuple[str, str]) -> None:
        """Wait for the tenant's next request to be prepared, at most `precompute_defer_s`."""
        try:
            await asyncio.wait((waiter,), timeout=self.config.precompute_defer_s)
        finally:
            if not waiter.done():  # timed out (or cancelled at shutdown): stop listening
                waiter.cancel()
                waiting = self._deferred.get(key)
                if waiting is not None and waiter in waiting:
                    waiting.remove(waiter)
                    if not waiting:
                        del self._deferred[key]

    async def precompute(self, job: Job) -> list[SummaryRequest]:
        """Predict and compute; returns the requests it computed (for tests and the benchmark)."""
        route, request = job.route, job.request
        conversation = job.conversation
        if conversation is None:
            conversation = await asyncio.to_thread(self.runner.conversation, request, route)
        budget = self.runner.request_budget(request, route, job.window)
        if budget is None or budget.limit <= 0 or not conversation.messages:
            return []
        point = route.policy_config.precompute_ratio * budget.limit
        if conversation.tokens < point:
            return []
        known = self.service.source(route, job.tenant)
        base = job.sent or await self._settle(job, conversation, budget, known)
        if base.pending:
            return []  # the request itself is waiting for or computing these
        sent = summarised_tokens(base, route)
        per_request = growth(conversation)
        # Tokens the next requests may add before a range moves; at least one request's worth
        # when the summarising step alone does not fit (a later step trims the rest).
        reach = min(max(budget.limit - sent, per_request), int(job.lookahead * per_request))
        if sent < point or reach <= 0:
            return []
        same_turn, new_turn = fillers(request)
        if same_turn is not None:
            computed, moved = await self._predict(
                job, conversation, budget, known, same_turn, reach, base
            )
            if moved:
                return computed
        # This Turn will not move the cut (or no Turn is under way): the next Turn might.
        computed, moved = await self._predict(
            job, conversation, budget, known, new_turn, reach, base
        )
        if computed or sent <= budget.trigger:
            return computed
        # Nothing to make for the next Turn (stored already, or no move), and the summarising
        # steps leave the request over the trigger: a range that moves with the Turn count
        # alone (`summarize_old`) may move on the Turn after, extending the summary before it.
        # Make that one now, or a short Turn ends before it is ready. The two new Turns are
        # empty, so ranges that move with tokens are not guessed at here, and ranges that would
        # reach them (or this Turn's coming answer) are left out.
        after = extended(extended(conversation, new_turn, 0), new_turn, 0)
        computed = await self._settle_computing(job, after, budget, known)
        return computed

    async def _predict(
        self,
        job: Job,
        conversation: Conversation,
        budget: Budget,
        known: RequestSummaries,
        filler: Message,
        reach: int,
        base: ChainResult,
    ) -> tuple[list[SummaryRequest], bool]:
        """Compute what the chain asks for when `filler` (at most `reach` tokens) crosses; and
        whether the filler moves a summarised range at all (stored already or not)."""
        probe = await self._settle(job, extended(conversation, filler, reach), budget, known)
        moved = summarised(probe, job.route) != summarised(base, job.route)
        if not probe.pending:
            return [], moved  # not crossing within the next requests, or already stored
        if not self._not_being_made(job, probe.pending):
            return [], True  # an earlier precomputation (or a request) is making it
        low, high = 0, reach
        for _ in range(SEARCH_STEPS):
            middle = (low + high) // 2
            if middle <= low:
                break
            probe = await self._settle(job, extended(conversation, filler, middle), budget, known)
            if probe.pending:
                high = middle
            else:
                low = middle
        longer = extended(conversation, filler, high)
        return await self._settle_computing(job, longer, budget, known), True

    def _not_being_made(self, job: Job, wanted: Sequence[SummaryRequest]) -> list[SummaryRequest]:
        """`wanted` without what is being computed already (by a request or an earlier
        precomputation). Waiting for those here would only hold a slot and repeat the chain
        runs that the one computing them makes once they are ready (`_settle_computing` goes
        on to the links that follow); the next response predicts again."""
        return [
            r
            for r in wanted
            if not self.service.computing(self.service.key(r, job.route, job.tenant))
        ]

    async def _settle(
        self, job: Job, conversation: Conversation, budget: Budget, known: RequestSummaries
    ) -> ChainResult:
        """Run the chain, answering from the store, until it asks for nothing the store has."""
        route, tenant = job.route, job.tenant
        chain = self.runner.chain_for(route, tenant, known)
        result = await asyncio.to_thread(chain, conversation, budget)
        for _ in range(MAX_ROUNDS):
            found = False
            for wanted in result.pending:
                answer = await self.service.cached(self.service.key(wanted, route, tenant))
                if answer is not None:
                    known.add(wanted, answer)
                    found = True
            if not found:
                break
            result = await asyncio.to_thread(chain, conversation, budget)
        return result

    async def _settle_computing(
        self, job: Job, conversation: Conversation, budget: Budget, known: RequestSummaries
    ) -> list[SummaryRequest]:
        last = job.request.messages[-1]
        computed: list[SummaryRequest] = []
        for _ in range(MAX_ROUNDS):
            result = await self._settle(job, conversation, budget, known)
            wanted = [
                r
                for r in result.pending
                if not (r.messages and r.messages[-1] == last) and not synthetic(r)
            ]
            wanted = self._not_being_made(job, wanted)
            if not wanted:
                break
            for summary_request in wanted:
                key = self.service.key(summary_request, job.route, job.tenant)
                if self.service.recently_failed(key):
                    return computed
                task = self.service.compute(
                    key, summary_request, job.route, job.headers, job.request.api
                )
                answer = await asyncio.shield(task)
                computed.append(summary_request)
                if answer.status != "ready":
                    return computed
                known.add(summary_request, answer)
        return computed
