"""The decision (design D2, D4, D6): against a window, how much room the messages have
(`budget`), whether the request plainly fits, and, when it does not, what the policy chain makes
of the conversation: the result held for a conversation that only appended since its last
compaction event (`held.HeldResults`), else the chain run again (fetching the summaries it asks
for, at most `MAX_SUMMARY_ROUNDS` rounds), checked against the invariants before anything may be
sent (design D1).

Apart from the summaries it fetches, this is the policies' pure work: the same conversation,
budget and held results give the same chain result.
"""

from __future__ import annotations

import hmac
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from policies import Budget, ChainResult, Conversation, Env, Memo, Message, run_chain
from policies.invariants import TOOL_CALLS_PAIRED, check, check_tool_pairs
from policies.pinning import apply_pin_rules
from policies.summaries import SummaryAnswer, SummaryRequest, SummarySource, UnwritableError
from policies.summarising import SummarisingStep

from ..counting.prefix import Counted
from ..counting.tokens import PRIMING_TOKENS
from ..errors import ContextLengthExceededError, GatewayError
from ..ops.metrics import Metrics
from ..routing import Route
from ..summaries import SummaryAsk, SummaryService, unsummarisable
from ..tool_outputs import ToolOutputCache
from ..wire import WireRequest
from .held import HeldResults
from .shared_held import SharedEvents

log = logging.getLogger("compactgate.pipeline")

MAX_SUMMARY_ROUNDS = 8  # links of a rolling summary fetched one after the other
MAX_MEMO_REFS = 4096  # tool-output refs remembered per process
EXPANSION_MAX_SHARE = 0.1  # the expansion tools may take at most this share of a window
OUTPUT_RESERVE_SHARE = 0.2  # of the window, for the output when nothing says (design D2.2)

Chain = Callable[[Conversation, Budget], ChainResult]  # a route's chain, ready to run


class Decision:
    """Budgets and the chain's answer for one process (module docstring)."""

    def __init__(
        self,
        metrics: Metrics,
        summaries: SummaryService,
        safety_margin: int,
        clamp_max_tokens: bool,
        ref_secret: bytes,
        tool_outputs: ToolOutputCache | None = None,
        shared: SharedEvents | None = None,
    ) -> None:
        self._summaries = summaries  # what the chains' summaries are fetched from
        self._shared = shared  # compaction events other replicas made (a shared store only)
        self._tool_outputs = tool_outputs
        self._expansion_cost: dict[str, int] = {}
        self._held = HeldResults()  # each conversation's latest compaction event
        self._refs: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._memo = Memo()  # per-text results of the steps, reused across requests
        self._metrics = metrics
        self._margin = safety_margin
        self._clamp = clamp_max_tokens
        self.ref_secret = ref_secret  # the key of the refs steps make (shared by replicas)

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
            hold_ratio=config.hold_ratio,
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

    def plainly_fits(self, tokens: int, budget: Budget | None, route: Route) -> bool:
        """Under the trigger, and under the precompute point where a summary may be needed:
        the request goes as it is, and no conversation model needs to be built."""
        if budget is None:
            return True
        if budget.limit <= 0 or tokens > budget.trigger:
            return False
        summarising = any(isinstance(s, SummarisingStep) for s in route.policy.steps)
        return not summarising or tokens < route.policy_config.precompute_ratio * budget.limit

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
            scope=(route.name, route.counter.tokenizer.name, tenant),
        )

    async def decide(
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
        if chain is None and not force and self._shared is not None:
            chain = await self._extend_shared(scope, conversation, budget, route, tenant, request)
        if chain is not None and check(conversation, chain.conversation):
            chain = None  # cannot happen while the client only appends; an event then
        if chain is None:
            try:
                chain, complete = await self._run(
                    conversation, budget, route, tenant, force, headers, request.api
                )
            except UnwritableError as error:  # a message nested too deeply to be summarised
                raise unsummarisable(error) from None
            except GatewayError:
                raise
            except Exception:  # a fault in a step must not fail a request (design D1.9)
                self._metrics.policy_errors.inc()
                log.exception("compaction abandoned: a policy step failed; sent as it came")
                return request, budget, None
            if chain.error is not None:
                raise ContextLengthExceededError(chain.error, param="messages")
            if chain.changed and not self._valid(conversation, chain):
                chain = None
            if remember and complete and chain is not None and chain.changed:
                self._held.remember(scope, conversation, budget, chain)
                if self._shared is not None:
                    await self._shared.made(scope, conversation, budget)
        return request, budget, chain

    async def _extend_shared(
        self,
        scope: str,
        conversation: Conversation,
        budget: Budget,
        route: Route,
        tenant: str,
        request: WireRequest,
    ) -> ChainResult | None:
        """The latest event another replica made for this conversation, made again here over
        the same messages (`shared_held`), held and extended; None when there is none, it
        cannot be made again complete, or the conversation has grown past it."""
        assert self._shared is not None
        count = await self._shared.latest(scope, conversation, budget)
        if count is None or self._held.holds(scope, conversation, count, budget):
            return None  # none, or the one held here already: a new event is due
        prefix = Conversation(conversation.messages[:count])
        try:
            made, complete = await self._run(
                prefix, budget, route, tenant, False, None, request.api
            )
        except Exception:  # the request's own event, below, reports what is wrong
            return None
        if not (complete and made.changed and made.error is None and self._valid(prefix, made)):
            return None
        self._held.remember(scope, prefix, budget, made)
        return self._held.extend(scope, conversation, budget)

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
                budget.hold_ratio,
            )
        raise ContextLengthExceededError(
            f"max_tokens ({budget.reserved_output}) plus the tool definitions "
            f"({tools_tokens} tokens) and the gateway's margin and overhead "
            f"({budget.fixed_tokens - tools_tokens} tokens) leave no room for messages in the "
            f"{budget.context_window}-token context window.",
            param="max_tokens" if request.max_output is not None else "tools",
        )


def _status(answers: Mapping[bytes, SummaryAnswer], request: SummaryRequest) -> str:
    answer = answers.get(request.canonical())
    return answer.status if answer is not None else "failed"
