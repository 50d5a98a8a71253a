"""From a validated request to the exact bytes to forward: count, budget, chain, check.

`Pipeline.prepare` is shared by the chat path, the reactive retry and the plan endpoint, so what
`/v1/compactgate/plan` shows is what a real request would send. It always starts from the
client's original request (a retry never compacts an already compacted body: envoy's rule).

An unchanged request is forwarded as the client's own bytes. A compacted one is re-serialised
once, after the invariant checker has passed it; a result that breaks an invariant is never sent
(the original is, and a metric counts it: design D1).

Counting only what can matter: when the route's tokenizer has a proven upper bound
(`MessageCounter.bound`) and the messages not counted yet are large, the request is measured by
that bound first. A bound under the trigger proves the exact count is under it too, so the
request is forwarded at once, `bounded`, and counted exactly off the request path (`late`), for
the next turn and for everything that reports tokens (`when_settled`). Only a bound that reaches
the trigger makes the request wait for its exact count.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from policies import (
    Budget,
    ChainResult,
    Conversation,
    Env,
    Memo,
    Message,
    StepReport,
    StoredOutput,
    run_chain,
)
from policies.invariants import TOOL_CALLS_PAIRED, check, check_tool_pairs
from policies.pinning import apply_pin_rules
from policies.summaries import SummaryAnswer, SummaryRequest, SummarySource
from policies.summarising import SummarisingStep

from .counting import Counting
from .errors import ContextLengthExceededError, InvalidRequestError
from .expansion import offer
from .held import HeldResults
from .metrics import Metrics
from .prefix import SYSTEM_ROLES, Counted, PrefixCounts
from .routing import Route
from .summaries import SummaryAsk, SummaryService
from .tokenizers import CharsTokenizer, UpstreamTokenizer
from .tokens import PRIMING_TOKENS, MessageCounter
from .tool_outputs import ToolOutputCache
from .wire import WireRequest

log = logging.getLogger("compactgate.pipeline")

MAX_SUMMARY_ROUNDS = 8  # links of a rolling summary fetched one after the other
MAX_MEMO_REFS = 4096  # tool-output refs remembered per process
EXPANSION_MAX_SHARE = 0.1  # the expansion tools may take at most this share of a window
OUTPUT_RESERVE_SHARE = 0.2  # of the window, for the output when nothing says (design D2.2)
# Messages not counted yet smaller than this (by their bound, ~bytes) are counted at once: it
# costs well under a millisecond, less than handing the count to a thread.
LATE_MIN_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class ExactCount:
    """The exact figures of a request forwarded on its upper bound, counted afterwards."""

    tokens: int  # the whole prompt
    system: int
    tools: int
    budget: Budget | None


Chain = Callable[[Conversation, Budget], ChainResult]  # a route's chain, ready to run

# Counts texts with a route's upstream tokenizer: (route, wire, texts, client headers) -> counts.
RemoteCounter = Callable[
    [Route, Any, Sequence[str], Sequence[tuple[bytes, bytes]] | None],
    Awaitable[list[int] | None],
]


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


class Pipeline:
    def __init__(
        self,
        metrics: Metrics,
        summaries: SummaryService,
        safety_margin: int,
        clamp_max_tokens: bool,
        ref_secret: bytes,
        inject_stream_usage: bool = False,
        tool_outputs: ToolOutputCache | None = None,
        count_remote: RemoteCounter | None = None,
        counting: Counting | None = None,
    ) -> None:
        self.counting = counting if counting is not None else Counting()
        self._count_remote = count_remote  # the upstream's own counts (`tokenizer: upstream`)
        self._summaries = summaries  # what the chains' summaries are fetched from
        self._tool_outputs = tool_outputs
        self._expansion_cost: dict[str, int] = {}
        self._prefix = PrefixCounts()
        self._settling: dict[str, asyncio.Task[ExactCount]] = {}  # latest late count per scope
        self._held = HeldResults()  # each conversation's latest compaction event
        self._refs: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._memo = Memo()  # per-text results of the steps, reused across requests
        self._metrics = metrics
        self._margin = safety_margin
        self._clamp = clamp_max_tokens
        self._inject_usage = inject_stream_usage
        self.ref_secret = ref_secret  # shared by the replicas (design D13.2)

    def budget(
        self, request: WireRequest, route: Route, tools_tokens: int, window: int | None
    ) -> Budget | None:
        if window is None:
            return None
        if request.max_output is not None:
            # A model never writes more than its configured maximum, whatever a client asks
            # (Claude Code asks for up to 128k): reserving more would compact for nothing.
            reserve = request.max_output
            if route.max_output_tokens is not None:
                reserve = min(reserve, route.max_output_tokens)
        elif route.max_output_tokens is not None:
            reserve = min(route.max_output_tokens, int(window * 0.5))
        else:
            reserve = int(window * OUTPUT_RESERVE_SHARE)
        config = route.policy_config
        return Budget(
            context_window=window,
            reserved_output=reserve,
            fixed_tokens=tools_tokens
            + PRIMING_TOKENS
            + self._margin
            + self.expansion_tokens(route, window),
            trigger_ratio=config.trigger_ratio,
            target_ratio=config.target_ratio,
        )

    def expansion_tokens(self, route: Route, window: int | None) -> int:
        """What the expansion tools and their system line cost, when this route may add them.

        Reserved up front: they are added after the chain ran, so the chain must leave room. A
        window too small to spare `EXPANSION_MAX_SHARE` of itself for them gets no tools (0).
        """
        cache = self._tool_outputs
        if cache is None or not cache.config.expand:
            return 0
        cost = self._expansion_cost.get(route.name)
        if cost is None:
            if not any(step.type == "tool_output_cache" for step in route.policy.steps):
                cost = 0
            else:
                note = {"role": "system", "content": cache.system_note()}
                cost = route.counter.tools(cache.tool_definitions()) + route.counter.message(note)
            self._expansion_cost[route.name] = cost
        if window is None or cost > window * EXPANSION_MAX_SHARE:
            return 0
        return cost

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

    def conversation(
        self, request: WireRequest, route: Route, counted: Counted | None = None
    ) -> Conversation:
        if counted is None:
            counts: Sequence[int] = [route.counter.message(m) for m in request.messages]
            uids: Sequence[int | None] = [None] * len(counts)
        else:
            counts, uids = counted.counts, counted.uids
        # Positional: this builds every message of every request that needs a policy.
        messages = tuple(
            Message(data, counts[i], marks.pin, marks.priority, marks.kind, i, uids[i])
            for i, (data, marks) in enumerate(zip(request.messages, request.marks, strict=True))
        )
        return Conversation(apply_pin_rules(messages, route.policy_config.pin_rules))

    def request_budget(
        self, request: WireRequest, route: Route, window: int | None
    ) -> Budget | None:
        """The budget of `request` against `window`, its tool definitions counted."""
        return self.budget(request, route, self.tools_tokens(request, route), window)

    def chain_for(self, route: Route, tenant: str, summaries: SummarySource) -> Chain:
        """The route's chain for `tenant`, answered by `summaries` alone (nothing is fetched)."""
        env = self.env(route, tenant, summaries)
        return lambda conversation, budget: run_chain(conversation, budget, route.policy, env)

    def env(self, route: Route, tenant: str, summaries: SummarySource) -> Env:
        secret = self.ref_secret + tenant.encode()
        refs = self._refs

        def ref_for(text: str) -> str:
            # Memoised: the same outputs are masked again on every turn of a conversation.
            key = (tenant, text)
            ref = refs.get(key)
            if ref is None:
                data = text.encode("utf-8", "surrogatepass")
                ref = "ref_" + hmac.digest(secret, data, "sha256").hex()[:24]
                refs[key] = ref
                if len(refs) > MAX_MEMO_REFS:
                    refs.popitem(last=False)
            return ref

        return Env(
            count=route.counter.message,
            summaries=summaries,
            ref_for=ref_for,
            count_text=route.counter.text,
            memo=self._memo,
        )

    async def prepare(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        *,
        window: int | None,
        force: bool = False,
        observe: bool = False,
        headers: Sequence[tuple[bytes, bytes]] | None = None,
        remember: bool = True,
        count_late: bool = False,
    ) -> Prepared:
        """Decide what to send for `request` against `window` (the effective context window).

        `headers` are the client's request headers; summaries missing from the store are
        computed with its credential. Without them only stored summaries are used (plan).
        `remember`: hold a compaction event's result for the conversation's next requests
        (`held`); a question about a request (plan, count_tokens) reads what is held only.
        `count_late`: a request whose upper bound fits may be forwarded before it is counted
        exactly (`bounded`); without it every figure is exact.
        """
        await self._learn_counts(request, route, headers)
        scope = f"{tenant}|{route.name}"
        counter = route.counter
        counted = self._prefix.known(
            scope, counter.tokenizer.name, request.messages, len(request.body)
        )
        rest = request.messages[len(counted.counts) :]
        if count_late and not force and counter.bound is not None and rest:
            early = await self._on_bound(request, route, tenant, counted, window, observe)
            if early is not None:
                return early
        counts = counted.counts
        if len(counts) < len(request.messages):  # (`_on_bound` may have counted them all)
            rest = request.messages[len(counts) :]
            counts.extend(await self.counting.exact(counter, tenant, rest))
        tools_tokens = self.tools_tokens(request, route)
        budget = self.budget(request, route, tools_tokens, window)
        if request.stateful or (not force and self._plainly_fits(sum(counts), budget, route)):
            return self._unchanged(request, route, counted, counts, tools_tokens, budget, observe)
        conversation = self.conversation(request, route, counted)
        request, budget, chain = await self._decide(
            request, conversation, route, tenant, budget, tools_tokens, force, headers, remember
        )
        return self._prepared(
            request, route, counted, conversation, chain, budget, tools_tokens, observe
        )

    async def _decide(
        self,
        request: WireRequest,
        conversation: Conversation,
        route: Route,
        tenant: str,
        budget: Budget | None,
        tools_tokens: int,
        force: bool,
        headers: Sequence[tuple[bytes, bytes]] | None,
        remember: bool,
    ) -> tuple[WireRequest, Budget | None, ChainResult | None]:
        """The chain's answer for a conversation over its trigger: the result held for the
        conversation when it only appended, else a new compaction event (remembered when
        `remember`). The request comes back with a smaller output reserve when even an empty
        history would not fit the requested one."""
        if budget is None:
            return request, None, None
        scope = f"{tenant}|{route.name}"
        if budget.limit <= 0:
            budget = self._too_small(request, budget, tools_tokens)
            request = request.with_max_output(budget.reserved_output)  # what is forwarded
        chain = None if force else self._held.extend(scope, conversation, budget)
        if chain is not None and check(conversation, chain.conversation):
            chain = None  # cannot happen while the client only appends; an event then
        if chain is None:
            chain, complete = await self._run(
                conversation, budget, route, tenant, force, headers, request.api
            )
            if chain.error is not None:
                raise ContextLengthExceededError(chain.error, param="messages")
            if chain.changed and not self._valid(conversation, chain):
                chain = None
            if remember and complete and chain is not None and chain.changed:
                self._held.remember(scope, conversation, budget, chain)
        return request, budget, chain

    def _prepared(
        self,
        request: WireRequest,
        route: Route,
        counted: Counted,
        conversation: Conversation,
        chain: ChainResult | None,
        budget: Budget | None,
        tools_tokens: int,
        observe: bool,
    ) -> Prepared:
        """The body to forward (the chain's result, or the request as sent when nothing
        changed or the gateway only observes) and the figures reported about it."""
        result = chain.conversation if chain is not None and chain.changed else conversation
        changed = result is not conversation
        rename = route.upstream_model if route.renamed else None
        inject = self._injects(request, observe)
        expandable = False
        if observe or not changed:
            if rename is None and not request.has_extension and not inject:
                body = request.body
            else:
                body = serialise(request.forward_payload(None, rename, inject))
            sent: list[Any] = request.messages
        else:
            payload = request.forward_payload(result.messages, rename, inject, counted.uids)
            cache = self._expansion_offered(chain, budget, route)
            if cache is not None:
                offered = offer(request.api, payload, cache)
                if offered is not None:
                    payload, expandable = offered, True
            body = serialise(payload)
            sent = result.data()
        counts = Counter(m.role for m in (conversation if observe else result).messages)
        system = sum(m.tokens for m in result.messages if m.role in ("system", "developer"))
        important = {i for i, marks in enumerate(request.marks) if marks.pin or marks.priority == 1}
        kept = {m.origin for m in result.messages} if important else set()
        return Prepared(
            route=route,
            body=body,
            tokens_before=conversation.tokens + tools_tokens + PRIMING_TOKENS,
            tokens_after=result.tokens + tools_tokens + PRIMING_TOKENS,
            budget=budget,
            chain=chain,
            counts_by_role=dict(counts),
            tokens_by_region={
                "system": system,
                "tools": tools_tokens,
                "history": result.tokens - system,
            },
            messages=sent,
            observe=observe,
            api=request.api,
            correction=_correction(route),
            injected_usage=inject,
            expandable=expandable,
            conversation=conversation,
            uids=tuple(counted.uids),
            priority_preserved=len(important & kept) / len(important) if important else 1.0,
        )

    def _expansion_offered(
        self, chain: ChainResult | None, budget: Budget | None, route: Route
    ) -> ToolOutputCache | None:
        """The cache whose masked outputs are offered back to the model (the expansion tool):
        when the chain stored some, expansion is on, and the window leaves room for the tool."""
        cache = self._tool_outputs
        if chain is None or not chain.stored or cache is None or not cache.config.expand:
            return None
        if budget is None or not self.expansion_tokens(route, budget.context_window):
            return None
        return cache

    def _plainly_fits(self, tokens: int, budget: Budget | None, route: Route) -> bool:
        """Under the trigger, and under the precompute point where a summary may be needed:
        the request goes as it is, and no conversation model needs to be built."""
        if budget is None:
            return True
        if budget.limit <= 0 or tokens > budget.trigger:
            return False
        summarising = any(isinstance(s, SummarisingStep) for s in route.policy.steps)
        return not summarising or tokens < route.policy_config.precompute_ratio * budget.limit

    def _unchanged(
        self,
        request: WireRequest,
        route: Route,
        counted: Counted,
        counts: Sequence[int],
        tools_tokens: int,
        budget: Budget | None,
        observe: bool,
        late: asyncio.Future[ExactCount] | None = None,
    ) -> Prepared:
        """The fast path: forward the client's own bytes (or a rename of them). With `late`,
        `counts` and `tools_tokens` are upper bounds and `late` makes the exact figures.
        `counted` gives the uids and roles (`counts` may differ from its counts: bounds)."""
        rename = route.upstream_model if route.renamed else None
        inject = self._injects(request, observe)
        truncate = request.stateful and route.stateful_truncation and not observe
        if rename is None and not request.has_extension and not inject and not truncate:
            body = request.body
        else:
            payload = request.forward_payload(None, rename, inject)
            if truncate:
                payload.setdefault("truncation", "auto")
            body = serialise(payload)
        system = sum(map(counts.__getitem__, counted.roles.system))
        in_messages = sum(counts)
        total = in_messages + tools_tokens + PRIMING_TOKENS
        return Prepared(
            route=route,
            body=body,
            tokens_before=total,
            tokens_after=total,
            budget=budget,
            chain=None,
            counts_by_role=counted.roles.tally,
            tokens_by_region={
                "system": system,
                "tools": tools_tokens,
                "history": in_messages - system,
            },
            messages=request.messages,
            observe=observe,
            api=request.api,
            correction=_correction(route),
            injected_usage=inject,
            uids=tuple(counted.uids),
            bounded=late is not None,
            late=late,
        )

    async def _on_bound(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        counted: Counted,
        window: int | None,
        observe: bool,
    ) -> Prepared | None:
        """The request forwarded on its upper bound, when that bound fits and the messages not
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
        budget = self.budget(request, route, tools, window)
        base = sum(known)

        def fits(rest_bound: int) -> bool:
            return request.stateful or self._plainly_fits(base + rest_bound, budget, route)

        made: list[int | None] = [None] * len(rest)
        if not fits(size):
            # Before counting, the tighter bound: every byte it takes off is a byte less
            # to count, roughly (the lower of two upper bounds is one).
            sizes = [min(s, bound.narrow(m)) for s, m in zip(sizes, rest, strict=True)]
            if not fits(sum(sizes)):
                made = await self.counting.until(route.counter, tenant, rest, sizes, fits)
                if None not in made:
                    counted.counts.extend(made)  # type: ignore[arg-type]  # all exact, none None
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
        return self._unchanged(request, route, counted, counts, tools, budget, observe, late)

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
        budget = self.budget(request, route, tools, window)
        return ExactCount(sum(exact) + tools + PRIMING_TOKENS, system, tools, budget)

    async def _learn_counts(
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

    def tools_tokens(
        self, request: WireRequest, route: Route, counter: MessageCounter | None = None
    ) -> int:
        """Tokens the request's tool definitions add to the prompt (by `counter`: the route's,
        or its upper bound)."""
        return request.wire.tools_tokens(request, counter or route.counter)

    def _injects(self, request: WireRequest, observe: bool) -> bool:
        """Whether to ask a chat stream for the usage the client did not ask for (the other
        APIs always report it)."""
        return (
            self._inject_usage
            and request.api == "chat"
            and request.stream
            and not request.include_usage
            and not observe
        )

    async def _run(
        self,
        conversation: Conversation,
        budget: Budget,
        route: Route,
        tenant: str,
        force: bool,
        headers: Sequence[tuple[bytes, bytes]] | None = None,
        api: str = "chat",
    ) -> tuple[ChainResult, bool]:
        """The chain's result, and whether it is complete: every summary it asked for was
        there (a result made without one is not held: the next request tries again)."""
        summaries = self._summaries.source(route, tenant)
        env = self.env(route, tenant, summaries)
        result = run_chain(conversation, budget, route.policy, env, force=force)
        ask = SummaryAsk(None if headers is None else tuple(headers), wait=force, api=api)
        for _ in range(MAX_SUMMARY_ROUNDS):
            if not result.pending:
                break
            answers = dict(await summaries.fetch(result.pending, ask))
            missing = [r for r in result.pending if _status(answers, r) == "missing"]
            if missing:
                # Being made in the background (design D7.7). If the steps up to the summarising
                # ones already fit the request without them, send that now (no fallback step loses
                # messages); else wait for them, at most `summaries.wait_s`.
                early = self._without_fallbacks(conversation, budget, route, env, force, result)
                if early is not None:
                    return early, False
                answers.update(await summaries.fetch(missing, SummaryAsk(ask.headers, True, api)))
            summaries.learn(result.pending, answers)
            result = run_chain(conversation, budget, route.policy, env, force=force)
        return result, not result.pending and summaries.complete()

    def _without_fallbacks(
        self,
        conversation: Conversation,
        budget: Budget,
        route: Route,
        env: Env,
        force: bool,
        result: ChainResult,
    ) -> ChainResult | None:
        """The chain cut after its last summarising step, if that alone fits the request.

        `result` is the whole chain's run on the same input: when no step after the summarising
        ones changed anything, the cut chain gives the same conversation, so it is not run again.
        """
        steps = route.policy.steps
        last = [i for i, s in enumerate(steps) if isinstance(s, SummarisingStep)]
        if not last:
            return None
        allowed = {step.type for step in steps[: last[-1] + 1]}
        later = {step.type for step in steps[last[-1] + 1 :]}
        if (
            allowed.isdisjoint(later)
            and result.tokens_after <= budget.limit
            and result.recovery is None
            and all(r.type in allowed or not r.changed for r in result.steps)
        ):
            return result
        policy = replace(route.policy, steps=steps[: last[-1] + 1])
        early = run_chain(conversation, budget, policy, env, force=force)
        allowed = {step.type for step in policy.steps}
        if early.tokens_after > budget.limit or any(r.type not in allowed for r in early.steps):
            return None  # it needs emergency, recovery, or a fallback step: wait instead
        return early

    def _valid(self, original: Conversation, chain: ChainResult) -> bool:
        violations = check(original, chain.conversation, allow_truncated=chain.recovery is not None)
        if violations:
            # The client's own request may already leave tool calls unpaired; only new breaks
            # count.
            before = {v.message for v in check_tool_pairs(original.data())}
            violations = [
                v for v in violations if v.rule != TOOL_CALLS_PAIRED or v.message not in before
            ]
        for violation in violations:
            self._metrics.invariant_violations.labels(violation.rule).inc()
            log.error("compaction refused: %s %s", violation.rule, violation.message)
        return not violations

    def _too_small(self, request: WireRequest, budget: Budget, tools_tokens: int) -> Budget:
        """The output reserve plus tools leave no room: clamp max_tokens or fail clearly."""
        if request.max_output is not None and self._clamp:
            reserve = max(1, budget.context_window // 4)
            return Budget(
                budget.context_window,
                reserve,
                budget.fixed_tokens,
                budget.trigger_ratio,
                budget.target_ratio,
            )
        raise InvalidRequestError(
            f"max_tokens ({budget.reserved_output}) plus the tool definitions "
            f"({tools_tokens} tokens) "
            f"leave no room for messages in the {budget.context_window}-token context window.",
            param="max_tokens" if request.max_output is not None else "tools",
            code="context_length_exceeded",
        )


def when_settled(prepared: Prepared | None, then: Callable[[Prepared | None], None]) -> None:
    """`then(prepared)` with exact figures: at once when they are known, else when the count
    made off the request path ends (with the bound, still `bounded`, if it was abandoned)."""
    late = prepared.late if prepared is not None else None
    if late is None or late.done() or prepared is None:
        then(prepared.settled() if prepared is not None else None)
        return
    late.add_done_callback(lambda _: then(prepared.settled()))


def _correction(route: Route) -> float | None:
    """The calibration multiplier of the route's heuristic tokenizer, None for exact ones."""
    tokenizer = route.counter.tokenizer
    return tokenizer.correction if isinstance(tokenizer, CharsTokenizer) else None


def _status(answers: Mapping[bytes, SummaryAnswer], request: SummaryRequest) -> str:
    answer = answers.get(request.canonical())
    return answer.status if answer is not None else "failed"


def serialise(payload: Mapping[str, Any]) -> bytes:
    """The body to forward. orjson reads 1024 levels of nesting but writes fewer: a body between
    the two can only be refused here, when it has to be written again (passthrough never is)."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError as exc:
        raise InvalidRequestError(
            f"The request body cannot be forwarded once changed: {exc}."
        ) from None
