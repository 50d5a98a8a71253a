"""The engine's entry point: what to forward for a parsed request (design D1-D4, D12).

`Engine.prepare(request, route, tenant, window=...)` takes a parsed conversation (a
`WireRequest` of any API), the model's settings and policy (`route`) and the window to fit,
and returns what to forward with its report (`Prepared`). Every door calls it: the three
compacting APIs and the Responses WebSocket (`http.endpoints`), the reactive retry
(`path.forward`), the plan endpoint and CLI, the gateway's own calls (`path.own_calls`). Apart
from the store and the summaries it is given, and the counts it remembers, it does no I/O.

    prepare
      measure   count what the conversation added (exactly, or by its upper bound first)
      decide    the budget; when over the trigger, the chain's result (held or made anew),
                checked against the invariants
      render    the exact bytes to forward and their figures

It always starts from the client's original request: a retry never compacts an already
compacted body.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies import Budget, Conversation
from policies.summaries import SummarySource

from ..counting.prefix import Counted
from ..counting.runner import Counting
from ..ops.metrics import Metrics
from ..routing import Route
from ..summaries import SummaryService
from ..tool_outputs import ToolOutputCache
from ..wire import WireRequest
from .decide import Chain, Decision
from .measure import Measure, RemoteCounter
from .prepared import Prepared
from .render import Render
from .shared_held import SharedEvents


class Engine:
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
        shared: SharedEvents | None = None,
    ) -> None:
        self.decision = Decision(
            metrics, summaries, safety_margin, clamp_max_tokens, ref_secret, tool_outputs, shared
        )
        decision = self.decision
        self.measure = Measure(
            counting if counting is not None else Counting(),
            decision.budget,
            decision.plainly_fits,
            count_remote,
            report=metrics,
        )
        self.render = Render(tool_outputs, decision.expansion_tokens, inject_stream_usage)

    @property
    def ref_secret(self) -> bytes:
        """The key of the refs the chain makes (and of the compaction items issued)."""
        return self.decision.ref_secret

    @property
    def counting(self) -> Counting:
        return self.measure.counting

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
        offer_expansion: bool = True,
    ) -> Prepared:
        """Decide what to send for `request` against `window` (the effective context window).

        `headers`: the client's, whose credential computes missing summaries (without them, as
        for the plan, only stored summaries are used). `remember`: hold a compaction event's
        result for the conversation's next requests (a question about a request, plan or
        count_tokens, reads what is held only). `count_late`: a request whose upper bound fits
        may be forwarded before it is counted exactly (`bounded`). `offer_expansion`: False
        where the caller forwards the messages alone (design D13.4).
        """
        measure = self.measure
        decision = self.decision
        render = self.render
        await measure.learn_remote(request, route, headers)
        counted = measure.known(request, route, tenant)
        more = len(counted.counts) < len(request.messages)
        if count_late and not force and route.counter.bound is not None and more:
            bounded = await measure.bound(request, route, tenant, counted, window)
            if bounded is not None:
                return render.render(
                    request,
                    route,
                    counted,
                    bounded.counts,
                    bounded.tools,
                    bounded.budget,
                    observe,
                    late=bounded.late,
                )
        counts = await measure.exact(request, route, tenant, counted)
        tools_tokens = measure.tools_tokens(request, route)
        budget = decision.budget(request, route, tools_tokens, window)
        if request.stateful or (not force and decision.plainly_fits(sum(counts), budget, route)):
            return render.render(request, route, counted, counts, tools_tokens, budget, observe)
        conversation = decision.conversation(request, route, counted)
        request, budget, chain = await decision.decide(
            request, conversation, route, tenant, budget, tools_tokens, force, headers, remember
        )
        return render.render(
            request,
            route,
            counted,
            counts,
            tools_tokens,
            budget,
            observe,
            conversation=conversation,
            chain=chain,
            offer_expansion=offer_expansion,
        )

    # -- what the other parts ask of the engine -------------------------------------------

    def counts(self, request: WireRequest, route: Route, tenant: str) -> Counted:
        """Per-message counts and uids (`measure.Measure.counts`)."""
        return self.measure.counts(request, route, tenant)

    def tools_tokens(self, request: WireRequest, route: Route) -> int:
        """Tokens the request's tool definitions add to the prompt."""
        return self.measure.tools_tokens(request, route)

    def budget(
        self, request: WireRequest, route: Route, tools_tokens: int, window: int | None
    ) -> Budget | None:
        return self.decision.budget(request, route, tools_tokens, window)

    def conversation(self, request: WireRequest, route: Route) -> Conversation:
        """`request`'s messages as the chain sees them (for precomputed summaries)."""
        return self.decision.conversation(request, route)

    def request_budget(
        self, request: WireRequest, route: Route, window: int | None
    ) -> Budget | None:
        """The budget of `request` against `window`, its tool definitions counted."""
        return self.decision.budget(request, route, self.tools_tokens(request, route), window)

    def chain_for(self, route: Route, tenant: str, summaries: SummarySource) -> Chain:
        """The route's chain for `tenant`, answered by `summaries` alone (nothing is fetched)."""
        return self.decision.chain_for(route, tenant, summaries)
